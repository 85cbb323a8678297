"""Persistent, warp-specialized Hopper (sm_90a) GEMM written in CuTe DSL.

Computes, for every batch index ``l``, ``C[:, :, l] = cast(alpha * (A @ B^T) + beta *
Bias)`` with fp32 accumulation and epilogue math; with ``swiglu`` the SwiGLU of two
weights instead (``operands.py``). A is ``(M, K, L)``, B ``(N, K, L)``, C ``(M, N, L)``
(row-major; column-major too with ``store="direct"``), each K- or MN-major; the bias
is any ``(M, N, L)`` view (stride 0 broadcasts). ``views.py`` makes these views of
torch's operands. docs/gemm.md is the design in full; in short:

* One CTA = a producer warpgroup (warp 0 issues the TMA loads of a ``stages``-deep smem
  ring, multicast across a cluster) and one or two consumer warpgroups issuing WGMMA
  (``cooperative``: two share a tile; ``pingpong``: each owns alternate tiles, named
  barriers handing the mainloop over in tile order so one's epilogue overlaps the
  other's mainloop). A persistent static scheduler walks the tiles in swizzled bands.
* ``kernel`` sets up the shared state and branches to ``producer`` and ``consumer``;
  a consumer runs ``mainloop`` per tile, then the split-K reduce-scatter (``splitk.py``)
  and the store path (``epilogue.py``), which calls the fusion hooks.
* The accumulator is never written outside the WGMMAs: the epilogue works on opaque
  copies (``ptx.py``), and with epilogue math those start only after the tile's last
  ring slot is released -- ptxas otherwise serializes the WGMMAs or holds the producer
  back.

Failure semantics: an invalid config raises ``ValueError`` (``GemmConfig``) at
construction; unsupported dtypes or layouts found while tracing raise ``ValueError``
before any MLIR is emitted. ``GemmProblem.why_not`` says up front whether a problem
suits.
Fusing: subclass and override ``epilogue_prefetch`` / ``epilogue_values`` /
``epilogue_op`` / ``epilogue_tile_input`` (``epilogue.EpilogueHooks``).
"""

# No ``from __future__ import annotations``: ``cute.struct`` reads the smem struct's
# annotations as types.
from typing import Any, Optional

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.memory import SmemAllocator
from cutlass.tensor_utils import LayoutEnum

from ..sm90 import THREADS_PER_WG, GemmBarrier
from .config import GemmConfig, epilogue_stages, gemm_dtype
from .epilogue import DirectStore, EpilogueHooks, TmaStore, epilogue_unit
from .operands import Loads, make_operands
from .ptx import EVICT_FIRST, EVICT_NORMAL, zero_after_release
from .splitk import SplitKReduce, init_reduce_barriers, split_k_range
from .transform_a import PrologueHooks, TransformedAOperands

__all__ = ["Sm90Gemm"]

_DEFAULT_NUM_SMS = 132  # H100 SXM / H200
# The largest operand (bytes, all batches) whose singly-read tiles load evict-first.
_EVICT_FIRST_MAX_BYTES = 256 * 1024 * 1024

class Walk:
    """The persistent walk of one CTA: its linear cluster-work indices and their tiles."""

    def __init__(self, gemm, clusters_m, clusters_n, total, cta_crd, start, stride):
        self.gemm, self.clusters_m, self.clusters_n = gemm, clusters_m, clusters_n
        self.total, self.cta_crd = total, cta_crd
        self.start, self.stride = start, stride  # this CTA's first index, the launched clusters

    def tile(self, linear):
        return self.gemm.tile_of(linear, self.clusters_m, self.clusters_n, self.cta_crd[0],
                                 self.cta_crd[1])


class Sm90Gemm(EpilogueHooks, PrologueHooks):
    """Persistent warp-specialized TMA + WGMMA GEMM for sm_90a.

    ``Sm90Gemm(config)`` or ``Sm90Gemm(**fields)``: a ``GemmConfig`` or its fields (the
    compile-time constants); ``swap_ab`` is the caller's and changes nothing here.

    :param acc_dtype: accumulator type; only ``cutlass.Float32``.
    :param max_active_clusters: persistent grid cap; default
        ``config.resident_clusters(num_sms)``.
    :param num_sms: SM count used for that default (132 for H100/H200).
    """

    def __init__(self, config: Optional[GemmConfig] = None, *, acc_dtype: Any = cutlass.Float32,
                 max_active_clusters: Optional[int] = None, num_sms: int = _DEFAULT_NUM_SMS,
                 **fields: Any):
        if config is None:
            config = GemmConfig(**fields)
        elif fields:
            raise TypeError(f"Sm90Gemm: a config and fields {sorted(fields)}")
        if gemm_dtype(acc_dtype) != gemm_dtype("fp32"):
            raise ValueError(f"Sm90Gemm: acc_dtype must be Float32, got {acc_dtype}")
        self.config = config
        self.tile_m, self.tile_n, self.tile_k = config.tile_m, config.tile_n, config.tile_k
        self.cluster_m, self.cluster_n = config.cluster_m, config.cluster_n
        self.cluster_size = self.cluster_m * self.cluster_n
        self.requested_stages = config.stages
        self.raster, self.group_size = config.raster, config.group_size
        self.cooperative, self.pingpong = config.cooperative, config.pingpong
        self.store, self.split_k, self.swiglu = config.store, config.split_k, config.swiglu
        self.pdl = config.pdl
        # the variants: what the mainloop multiplies, how a tile is stored, the K split
        self.operands = (TransformedAOperands(self) if config.transform_a
                         else make_operands(self, config.swiglu))
        self.output = TmaStore(self) if config.store == "tma" else DirectStore(self)
        self.reduction = SplitKReduce(self) if config.split_k > 1 else None
        # Math between the accumulator and the store (a fusion hook, or SwiGLU's) starts
        # only once the tile's last ring slot is released (see ptx.zero_after_release).
        self.epilogue_math = (self.operands.combines
                              or type(self).epilogue_op is not Sm90Gemm.epilogue_op)
        self.acc_dtype = cutlass.Float32
        if max_active_clusters is None:
            max_active_clusters = config.resident_clusters(int(num_sms))
        if int(max_active_clusters) < 1:
            raise ValueError("Sm90Gemm: max_active_clusters must be >= 1")
        self.max_active_clusters = int(max_active_clusters)
        self.num_consumer_wgs = config.consumer_wgs
        self.num_consumer_threads = self.num_consumer_wgs * THREADS_PER_WG
        self.num_threads = THREADS_PER_WG + self.num_consumer_threads
        # consumer warpgroups sharing a tile: the threads that consume each stage and
        # store each tile
        self.tile_wgs = config.tile_wgs
        self.tile_threads = self.tile_wgs * THREADS_PER_WG
        self.mma_atom_layout = (self.tile_wgs, 1, 1)
        # epilogue sub-tile: rows of one M-repetition of the tiled MMA (64 per consumer
        # warpgroup of the tile) x 32 columns
        self.epi_tile = (64 * self.tile_wgs, 32)
        self.epi_unit = epilogue_unit(self.tile_m, self.tile_n, self.tile_wgs)
        self.producer_regs = 40
        self.consumer_regs = 232
        self.store_warp = 4  # first consumer warp issues the TMA stores

    @property
    def wide_up(self) -> bool:
        """Whether SwiGLU's two weight tiles run as one WGMMA twice as wide (known once
        traced)."""
        return self.operands.wide

    # -------------------------------------------------------- trace-time setup
    def _setup(self, a_dtype, b_dtype, c_dtype, a_layout, b_layout, c_layout):
        self.operands.check_dtypes(a_dtype, b_dtype)
        if (a_dtype.width == 8) != self.config.fp8:  # the config's resources are for its width
            raise ValueError(f"Sm90Gemm: {a_dtype} operands with fp8={self.config.fp8}")
        if c_dtype not in (cutlass.BFloat16, cutlass.Float16, cutlass.Float32,
                           cutlass.Float8E4M3FN, cutlass.Float8E5M2):
            raise ValueError(f"Sm90Gemm: unsupported output dtype {c_dtype}")
        if c_layout != LayoutEnum.ROW_MAJOR and self.store == "tma":
            raise ValueError("Sm90Gemm: C must be row-major (N contiguous) with store='tma'")
        self.a_dtype, self.b_dtype, self.c_dtype = a_dtype, b_dtype, c_dtype
        self.a_layout, self.b_layout = a_layout, b_layout
        c_bytes = c_dtype.width // 8
        self.stages = self.config.ring_stages(a_dtype.width // 8, c_bytes, b_dtype.width // 8)
        if self.stages < 2:
            raise ValueError(
                f"Sm90Gemm: {self.requested_stages} stages of a {self.tile_m}x"
                f"{self.tile_n}x{self.tile_k} tile do not fit in shared memory")
        self.epi_stages = epilogue_stages(c_bytes)
        self.tiled_mma = self.operands.make_tiled_mma(a_layout, b_layout)
        tile_mnk = (self.tile_m, self.tile_n, self.tile_k)
        a_tiles, b_tiles = self.config.operand_tiles
        self.sA_layout = sm90_utils.make_smem_layout_a(a_layout, tile_mnk, a_dtype,
                                                       self.stages * a_tiles)
        self.sB_layout = sm90_utils.make_smem_layout_b(b_layout, tile_mnk, b_dtype,
                                                       self.stages * b_tiles)
        self.operands.setup(a_layout, b_layout, a_dtype, b_dtype)
        # ping-pong: each consumer warpgroup has its own epi_stages buffers
        epi_groups = self.num_consumer_wgs // self.tile_wgs
        self.sC_layout = sm90_utils.make_smem_layout_epi(
            c_dtype, LayoutEnum.ROW_MAJOR, self.epi_tile, self.epi_stages * epi_groups)

    # ------------------------------------------------------------- host entry
    @cute.jit
    def __call__(self, mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor,
                 mBias: Optional[cute.Tensor], alpha: cutlass.Float32, beta: cutlass.Float32,
                 stream):
        """Launch ``C = alpha * A @ B^T + beta * Bias``. With the TVM-FFI ABI and an
        environment stream the compiled function is called as ``f(A, B, C, Bias_or_None,
        alpha, beta)``."""
        self.launch(mA, mB, mC, mBias, alpha, beta, stream)

    @cute.jit
    def launch(self, mA, mB, mC, mBias, alpha, beta, stream, epi_args=None, mA_up=None,
               mB_up=None, mTile=None, pro_args=None):
        """Trace-time body of ``__call__``. A fusing subclass defines its own ``__call__``
        with extra tensor arguments and forwards them here as ``epi_args`` (any pytree of
        tensors/scalars); they reach :meth:`epilogue_op` unchanged. ``mA_up`` / ``mB_up``:
        the second weight, with ``swiglu="a"`` / ``"b"`` (same shape and layout as ``mA``
        / ``mB``; only then). ``mTile``: an epilogue input laid out like C (same shape,
        dtype and strides; a residual), loaded by TMA into the store buffers ahead of each
        sub-tile and handed to :meth:`epilogue_tile_input` (16-bit C, ``store="tma"``, no
        split-K). ``pro_args``: ``transform_a``'s pass-through to :meth:`prologue_op`
        (``transform_a.py``; A then fp32, bf16 or fp16). Python numbers as ``alpha`` /
        ``beta`` (the template's ALPHA and BETA) are compile-time constants: a factor of 1
        then costs no multiply."""
        self.operands.check_weights(mA_up, mB_up)
        if cutlass.const_expr(self.swiglu != "" and mBias is not None):
            raise ValueError("Sm90Gemm: swiglu takes no bias")
        self.alpha_value = alpha if isinstance(alpha, (int, float)) else None
        self.beta_value = beta if isinstance(beta, (int, float)) else None
        alpha, beta = cutlass.Float32(alpha), cutlass.Float32(beta)
        self._setup(mA.element_type, mB.element_type, mC.element_type,
                    LayoutEnum.from_tensor(mA), LayoutEnum.from_tensor(mB),
                    LayoutEnum.from_tensor(mC))
        tma_a, tA, tma_b, tB, tma_up, t_up = self._operand_tmas(mA, mB, mA_up, mB_up)
        tma_c, tC, tma_t, tT = self._output_tmas(mC, mTile)
        tm, tn, tk = self.tile_m, self.tile_n, self.tile_k
        prob_m = cute.size(mC, mode=[0])
        prob_n = cute.size(mC, mode=[1])
        prob_l = cute.size(mC, mode=[2])
        prob_k = cute.size(mA, mode=[1])
        clusters_m = ((prob_m + tm - 1) // tm + self.cluster_m - 1) // self.cluster_m
        clusters_n = ((prob_n + tn - 1) // tn + self.cluster_n - 1) // self.cluster_n
        total_clusters = clusters_m * clusters_n * prob_l
        k_tiles = (prob_k + tk - 1) // tk
        num_persistent = min(total_clusters, self.max_active_clusters)
        self.smem_struct = self._smem_struct()
        self.kernel(
            tma_a, tA, tma_b, tB, tma_up, t_up, tma_c, tC, tma_t, tT, mBias, alpha, beta,
            epi_args, pro_args, self.tiled_mma, self.operands.tiled_mma_up,
            self.cluster_layout(),
            self.sA_layout, self.sB_layout, self.operands.sB_up_layout, self.sC_layout,
            prob_m, prob_n, clusters_m, clusters_n, total_clusters, k_tiles,
        ).launch(
            # with split-K the cluster's x extent also holds the K split
            grid=(self.cluster_m * self.split_k, self.cluster_n, num_persistent),
            block=[self.num_threads, 1, 1],
            cluster=(self.cluster_m * self.split_k, self.cluster_n, 1),
            min_blocks_per_mp=1,
            stream=stream,
            use_pdl=self.pdl,
        )

    def _operand_tmas(self, mA, mB, mA_up, mB_up):
        """TMA load atoms and tensors of A, B and the second weight (or None)."""
        tm, tn, tk = self.tile_m, self.tile_n, self.tile_k
        a_op = (cpasync.CopyBulkTensorTileG2SMulticastOp() if self.cluster_n > 1
                else cpasync.CopyBulkTensorTileG2SOp())
        b_op = (cpasync.CopyBulkTensorTileG2SMulticastOp() if self.cluster_m > 1
                else cpasync.CopyBulkTensorTileG2SOp())
        tma_a, tA = cpasync.make_tiled_tma_atom(
            a_op, mA, cute.slice_(self.sA_layout, (None, None, 0)), (tm, tk),
            num_multicast=self.cluster_n)
        tma_b, tB = cpasync.make_tiled_tma_atom(
            b_op, mB, cute.slice_(self.sB_layout, (None, None, 0)), (tn, tk),
            num_multicast=self.cluster_m)
        tma_up, t_up = self.operands.up_tma(a_op, b_op, mA_up, mB_up)
        return tma_a, tA, tma_b, tB, tma_up, t_up

    def _output_tmas(self, mC, mTile):
        """The TMA store atom of C (``store="tma"``; else None, C itself) and the tile
        input's load atom (or None)."""
        tma_c, tC = None, mC
        if self.store == "tma":
            tma_c, tC = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileS2GOp(), mC,
                cute.slice_(self.sC_layout, (None, None, 0)), self.epi_tile)
        self.tile_input = mTile is not None
        tma_t, tT = None, None
        if self.tile_input:
            if (self.store != "tma" or self.split_k > 1
                    or mTile.element_type != mC.element_type or mC.element_type.width != 16):
                raise ValueError("Sm90Gemm: a tile input needs store='tma', no split-K and "
                                 "a 16-bit C of its own dtype")
            tma_t, tT = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileG2SOp(), mTile,
                cute.slice_(self.sC_layout, (None, None, 0)), self.epi_tile)
        return tma_c, tC, tma_t, tT

    def _smem_struct(self):
        """The CTA's shared memory: ring and split-K / tile-input mbarriers, the A and B
        rings, the store buffers and the split-K reduction buffer."""
        stages = self.stages
        c_smem_elems = cute.cosize(self.sC_layout) if self.store == "tma" else 8
        epi_buffers = cute.size(self.sC_layout, mode=[2]) if self.store == "tma" else 1
        reduce_elems = max(self.config.reduce_bytes() // 4, 4)

        @cute.struct
        class GemmSmem:
            ring_bars: cute.struct.MemRange[cutlass.Int64, stages * 2]
            # split-K: "the peers' partials are ready", "the peers have read mine"
            reduce_bars: cute.struct.MemRange[cutlass.Int64, 2]
            # tile input: "store buffer b holds its sub-tile" (one per buffer)
            tile_bars: cute.struct.MemRange[cutlass.Int64, epi_buffers]
            smem_a: cute.struct.Align[
                cute.struct.MemRange[self.a_dtype, cute.cosize(self.sA_layout)], 1024]
            smem_b: cute.struct.Align[
                cute.struct.MemRange[self.b_dtype, cute.cosize(self.sB_layout)], 1024]
            smem_c: cute.struct.Align[
                cute.struct.MemRange[self.c_dtype, c_smem_elems], 1024]
            reduce_buf: cute.struct.Align[
                cute.struct.MemRange[cutlass.Float32, reduce_elems], 128]

        return GemmSmem

    def cluster_layout(self, vmnk: bool = False) -> cute.Layout:
        """CTA (m, n, split rank) -> its rank in the cluster: x = m + cluster_m * k
        (the launch's cluster x extent is ``cluster_m * split_k``), y = n. With
        ``vmnk``: the same with a leading unit mode, the pipeline's (v, m, n, k) view."""
        shape = (self.cluster_m, self.cluster_n, self.split_k)
        stride = (1, self.cluster_m * self.split_k, self.cluster_m)
        if vmnk:
            return cute.make_layout((1, *shape), stride=(1, *stride))
        return cute.make_layout(shape, stride=stride)

    # -------------------------------------------------------------- scheduler
    @cute.jit
    def tile_of(self, linear, clusters_m, clusters_n, cta_m, cta_n):
        """Map a linear cluster-work index to this CTA's (m_tile, n_tile, l): bands of
        ``group_size`` clusters along the fast direction (``raster``), walked across the
        other."""
        per_batch = clusters_m * clusters_n
        l_idx = linear // per_batch
        rem = linear - l_idx * per_batch
        fast_count, slow_count = clusters_m, clusters_n
        if cutlass.const_expr(self.raster == "n"):
            fast_count, slow_count = clusters_n, clusters_m
        g = self.group_size
        band_len = g * slow_count
        band = rem // band_len
        pos = rem - band * band_len
        first = band * g
        width = min(g, fast_count - first)
        cl_fast = first + pos % width
        cl_slow = pos // width
        cl_m, cl_n = cl_fast, cl_slow
        if cutlass.const_expr(self.raster == "n"):
            cl_m, cl_n = cl_slow, cl_fast
        return (cl_m * self.cluster_m + cta_m, cl_n * self.cluster_n + cta_n, l_idx)

    @staticmethod
    def stream_policy(readers, operand_bytes):
        """The L2 policy of an operand's TMA loads when ``readers`` clusters read each of
        its tiles: evict-first for a tile that one cluster reads (its multicast is one L2
        read) of an operand of at most ``_EVICT_FIRST_MAX_BYTES``, normal otherwise. A
        weight that small-M tiles stream once then does not push reused lines, or a
        previous kernel's dirty ones, out of L2 (a 1 GB one lost a few percent with it)."""
        streamed = (readers == 1) & (operand_bytes <= _EVICT_FIRST_MAX_BYTES)
        return cutlass.Int64(cutlass.select_(
            streamed, cutlass.Int64(EVICT_FIRST), cutlass.Int64(EVICT_NORMAL)))

    # ------------------------------------------------------ ping-pong handoffs
    # Warpgroup w waits on barrier 3 + w (bar.sync by its 128 threads) until the other
    # arrives on it (bar.arrive by its 128 threads) after issuing the last WGMMA of the
    # preceding tile. Both sides are predicated so that every arrive has one wait.
    def pingpong_wait_turn(self, pp_wg):
        """Block this consumer warpgroup until its mainloop turn."""
        pipeline.NamedBarrier(barrier_id=GemmBarrier.TURN_WG0 + pp_wg,
                              num_threads=2 * THREADS_PER_WG).arrive_and_wait()

    def pingpong_pass_turn(self, pp_wg):
        """Hand the mainloop turn to the other consumer warpgroup."""
        pipeline.NamedBarrier(barrier_id=GemmBarrier.TURN_WG0 + 1 - pp_wg,
                              num_threads=2 * THREADS_PER_WG).arrive()

    def pingpong_skip_stages(self, read_state, free_state, count):
        """Advance both consumer pipeline states past ``count`` ring stages (those of the
        other warpgroup's tile)."""
        read_state.advance(count)
        free_state.advance(count)

    # ---------------------------------------------------------------- kernel
    @cute.kernel
    def kernel(
        self,
        tma_a: cute.CopyAtom,
        tA: cute.Tensor,
        tma_b: cute.CopyAtom,
        tB: cute.Tensor,
        tma_up: Optional[cute.CopyAtom],
        t_up: Optional[cute.Tensor],
        tma_c: Optional[cute.CopyAtom],
        tC: cute.Tensor,
        tma_t: Optional[cute.CopyAtom],
        tT: Optional[cute.Tensor],
        mBias: Optional[cute.Tensor],
        alpha: cutlass.Float32,
        beta: cutlass.Float32,
        epi_args,
        pro_args,
        tiled_mma: cute.TiledMma,
        tiled_mma_up: cute.TiledMma,
        cluster_layout: cute.Layout,
        sA_layout: cute.ComposedLayout,
        sB_layout: cute.ComposedLayout,
        sB_up_layout: cute.ComposedLayout,
        sC_layout: cute.ComposedLayout,
        prob_m: cutlass.Int32,
        prob_n: cutlass.Int32,
        clusters_m: cutlass.Int32,
        clusters_n: cutlass.Int32,
        total_clusters: cutlass.Int32,
        k_tiles: cutlass.Int32,
    ):
        tm, tn, tk = self.tile_m, self.tile_n, self.tile_k
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = warp // 4
        if warp == 0:
            cpasync.prefetch_descriptor(tma_a)
            cpasync.prefetch_descriptor(tma_b)
            self.operands.prefetch_descriptors(tma_up)
            if cutlass.const_expr(self.store == "tma"):
                cpasync.prefetch_descriptor(tma_c)
            if cutlass.const_expr(self.tile_input):
                cpasync.prefetch_descriptor(tma_t)

        # (m, n, k) of this CTA in the cluster: its multicast coordinates and split rank
        cta_rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        cta_crd = cluster_layout.get_flat_coord(cta_rank)
        split_rank, split_base, k_begin, my_k_tiles = split_k_range(self, cta_rank, cta_crd,
                                                                    k_tiles)
        mask_a = 0
        mask_b = 0
        if cutlass.const_expr(self.cluster_n > 1):
            mask_a = cute.make_layout_image_mask(cluster_layout, cta_crd, mode=1)
        if cutlass.const_expr(self.cluster_m > 1):
            mask_b = cute.make_layout_image_mask(cluster_layout, cta_crd, mode=0)

        smem = SmemAllocator().allocate(self.smem_struct)
        reduce_ready = smem.reduce_bars.data_ptr()
        reduce_free = reduce_ready + 1
        init_reduce_barriers(self, warp, reduce_ready, reduce_free)
        tile_bars = smem.tile_bars.data_ptr()
        if cutlass.const_expr(self.tile_input):
            # fenced by the ring's creation below, as the split-K barriers
            if warp == 0:
                with cute.arch.elect_one():
                    for b in cutlass.range_constexpr(cute.size(sC_layout, mode=[2])):
                        cute.arch.mbarrier_init(tile_bars + b, 1)
        ring = self._make_ring(smem, sA_layout, sB_layout)
        if cutlass.const_expr(self.pdl):
            # every global access below (loads, epilogue inputs, stores) follows the
            # previous kernel's end; the setup above overlapped it
            cute.arch.griddepcontrol_wait()

        sA = smem.smem_a.get_tensor(sA_layout.outer, swizzle=sA_layout.inner)
        sB = smem.smem_b.get_tensor(sB_layout.outer, swizzle=sB_layout.inner)
        # (tm, tk, tiles_m, tiles_k, L) / (tn, tk, tiles_n, tiles_k, L)
        gA = cute.local_tile(tA, (tm, tk), (None, None, None))
        gB = cute.local_tile(tB, (tn, tk), (None, None, None))
        # TMA partitions: each CTA of a multicast group loads a slice
        tAsA, tAgA = cpasync.tma_partition(
            tma_a, cta_crd[1], cute.make_layout(self.cluster_n),
            cute.group_modes(sA, 0, 2), cute.group_modes(gA, 0, 2))
        tBsB, tBgB = cpasync.tma_partition(
            tma_b, cta_crd[0], cute.make_layout(self.cluster_m),
            cute.group_modes(sB, 0, 2), cute.group_modes(gB, 0, 2))
        tUg = self.operands.partition_up(tma_up, t_up, sA, sB, cta_crd)
        # trace-time state, as the layouts are: read inside the DSL's loops via self
        self.walk = Walk(self, clusters_m, clusters_n, total_clusters, cta_crd,
                         cute.arch.block_idx()[2], cute.arch.grid_dim()[2])
        self.operands.bind(prob_m, cute.size(tA, mode=[1]), pro_args)

        if wg == 0:
            cute.arch.setmaxregister_decrease(self.producer_regs)
            if warp == 0:
                # bytes of one operand row over K, every batch
                row_bytes = (cutlass.Int64(k_tiles * tk * (self.a_dtype.width // 8))
                             * (total_clusters // (clusters_m * clusters_n)))
                loads = Loads(tma_a, tma_b, tma_up, tAsA, tBsB, tAgA, tBgB, tUg, mask_a, mask_b,
                              self.stream_policy(clusters_n, row_bytes * prob_m),
                              self.stream_policy(clusters_m, row_bytes * prob_n))
                self.producer(ring, loads, k_begin, my_k_tiles)
        else:
            cute.arch.setmaxregister_increase(self.consumer_regs)
            # The consumers' own smem views, made by the consumer when it needs them. (The
            # DSL re-derives an object at the entry of a branch that calls it: these calls
            # keep the views' IR where it has always been.)
            views = (lambda: smem.smem_c.get_tensor(sC_layout.outer, swizzle=sC_layout.inner),
                     lambda: smem.reduce_buf.data_ptr(),
                     lambda: smem.smem_b.get_tensor(sB_up_layout.outer,
                                                    swizzle=sB_up_layout.inner))
            self.consumer(ring, tidx, warp, wg, sA, sB, views, tiled_mma,
                          tiled_mma_up, tma_c, tC, tma_t, tT, tile_bars, mBias, alpha, beta,
                          epi_args, prob_m, prob_n, k_tiles,
                          (split_rank, split_base, my_k_tiles), (reduce_ready, reduce_free))

    def _make_ring(self, smem, sA_layout, sB_layout):
        """The operand ring's pipeline. Creating it also initialises its mbarriers and
        syncs the whole cluster, so every CTA sees initialised barriers before any
        multicast or remote arrive. Multicast stays within one split rank (the K mode):
        consumers release the rings of their M/N partners."""
        a_tiles, b_tiles = self.config.operand_tiles
        stage_bytes = a_tiles * cute.size_in_bytes(
            self.a_dtype, cute.slice_(sA_layout, (None, None, 0))
        ) + b_tiles * cute.size_in_bytes(self.b_dtype, cute.slice_(sB_layout, (None, None, 0)))
        return pipeline.PipelineTmaAsync.create(
            barrier_storage=smem.ring_bars.data_ptr(),
            num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.tile_threads),
            tx_count=stage_bytes,
            cta_layout_vmnk=self.cluster_layout(vmnk=True),
            enable_multicast_signaling=True,
        )

    @cute.jit
    def producer(self, ring, loads, k_begin, my_k_tiles):
        """Warp 0 of the producer warpgroup: the TMA loads of every tile of the CTA's walk,
        stage by stage, into the ring."""
        prod_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                                  self.stages)
        linear = self.walk.start
        while linear < self.walk.total:
            m_t, n_t, l_t = self.walk.tile(linear)
            tile_loads = self.operands.tile_loads(loads, m_t, n_t, l_t)
            for kt in range(my_k_tiles):
                ring.producer_acquire(prod_state)
                bar = ring.producer_get_barrier(prod_state)
                self.operands.load_stage(tile_loads, k_begin + kt, prod_state.index, bar)
                ring.producer_commit(prod_state)
                prod_state.advance()
            linear += self.walk.stride
        ring.producer_tail(prod_state)

    @cute.jit
    def consumer(self, ring, tidx, warp, wg, sA, sB, views, tiled_mma,
                 tiled_mma_up, tma_c, tC, tma_t, tT, tile_bars, mBias, alpha, beta, epi_args,
                 prob_m, prob_n, k_tiles, split, reduce_bars):
        """A consumer warpgroup: its setup, then ``consume_tile`` for each tile of its walk. ``split``: (split rank, its tile's base rank,
        this CTA's K tiles); ``reduce_bars``: split-K's "ready" and "free" mbarriers."""
        split_rank, split_base, my_k_tiles = split
        ctid = tidx - THREADS_PER_WG
        wg_thread = (wg - 1) * THREADS_PER_WG
        # ping-pong: which of the two warpgroups this is (0 or 1), each one a whole
        # tile's MMA / epilogue thread group of its own
        pp_wg = 0
        store_warp = self.store_warp
        if cutlass.const_expr(self.pingpong):
            pp_wg = wg - 1
            ctid = tidx - wg * THREADS_PER_WG
            wg_thread = 0
            store_warp = self.store_warp + pp_wg * 4
        thr_mma = tiled_mma.get_slice(ctid)
        c_view, reduce_view, up_view = views
        frags = self.operands.fragments(tiled_mma, tiled_mma_up, wg_thread, sA, sB, up_view,
                                        ctid)
        if cutlass.const_expr(self.split_k > 1):
            self.reduction.setup(frags.acc, reduce_view(), *reduce_bars, ctid, split_rank,
                                 split_base)
        self.output.setup(c_view, tma_c, tC, tma_t, tT, tiled_mma, frags, ctid, pp_wg, store_warp,
                          split_rank)
        walk = self.walk
        ident = cute.make_identity_tensor((prob_m, prob_n))

        read_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer,
                                                  self.stages)
        free_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer,
                                                  self.stages)
        tiles_done = cutlass.Int32(0)
        linear = walk.start
        walk_stride = walk.stride
        if cutlass.const_expr(self.pingpong):
            # warpgroup 1 starts on the CTA's second tile, past the stages of the first;
            # both then take every other tile
            linear = walk.start + pp_wg * walk.stride
            walk_stride = 2 * walk.stride
            self.pingpong_skip_stages(read_state, free_state, k_tiles * pp_wg)
        if cutlass.const_expr(self.tile_input):
            self.output.preload_tile_input(warp, tile_bars, linear)
        mma = self.operands.mainloop_mma(tiled_mma, tiled_mma_up)
        sizes = (prob_m, prob_n, k_tiles, my_k_tiles)
        epi_inputs = (mBias, alpha, beta, epi_args)
        while linear < self.walk.total:
            tiles_done, linear, mma, read_state, free_state = self.consume_tile(
                ring, thr_mma, ident, frags, pp_wg, walk_stride, sizes, epi_inputs, warp,
                tile_bars, tiles_done, linear, mma, read_state, free_state)
        if cutlass.const_expr(self.split_k > 1):
            self.reduction.wait_free(tiles_done)
        self.output.finish(warp)

    @cute.jit
    def consume_tile(self, ring, thr_mma, ident, frags, pp_wg, walk_stride, sizes, epi_inputs,
                     warp, tile_bars, tiles_done, linear, mma, read_state, free_state):
        """One tile of a consumer warpgroup's walk (index ``linear``): wait for the
        mainloop turn (ping-pong), the mainloop, the release of the last stage, the
        split-K reduce-scatter, the epilogue and store. Returns the loop's state, advanced
        to the warpgroup's next tile."""
        prob_m, prob_n, k_tiles, my_k_tiles = sizes
        mBias, alpha, beta, epi_args = epi_inputs
        tile = self.walk.tile(linear)
        # global (m, n) of every accumulator element, in acc's layout
        coords = thr_mma.partition_C(
            cute.local_tile(ident, (self.tile_m, self.tile_n), (tile[0], tile[1])))
        if cutlass.const_expr(self.pingpong):
            if linear > self.walk.start:
                self.pingpong_wait_turn(pp_wg)
        read_state, free_state, mma = self.mainloop(ring, mma, frags, read_state, free_state,
                                                    my_k_tiles, tile)
        tile_coords = self.output.tile_coords(coords)
        upcoming = self.output.first_inputs(tile_coords, tile[2], prob_m, prob_n, mBias,
                                            epi_args)
        if cutlass.const_expr(self.pingpong):
            # every WGMMA of this tile is issued: the other warpgroup may start issuing
            # its next tile (if there is one)
            if linear + self.walk.stride < self.walk.total:
                self.pingpong_pass_turn(pp_wg)
        warpgroup.wait_group(0)
        free_state, released = self.release_last_stage(ring, free_state, my_k_tiles)
        if cutlass.const_expr(self.pingpong):
            # the other warpgroup's next tile comes next in the ring
            self.pingpong_skip_stages(read_state, free_state, k_tiles)
        if cutlass.const_expr(self.split_k > 1):
            self.reduction.reduce(tiles_done)
        self.output.store_tile(frags, tile, tile_coords, prob_m, prob_n, mBias, alpha, beta,
                               epi_args, upcoming, released, tiles_done, warp, tile_bars,
                               linear, walk_stride)
        return tiles_done + 1, linear + walk_stride, mma, read_state, free_state

    @cute.jit
    def mainloop(self, ring, mma, frags, read_state, free_state, k_tiles, tile):
        """One tile's k-tiles (of output ``tile``), one WGMMA batch kept in flight (the
        operands' stage hooks); each stage is released once the next one's WGMMAs are
        issued (the last one by ``release_last_stage``). The
        tile's first WGMMAs overwrite the accumulators (k >= 1, so there are some)
        instead of zeroing instructions between two tiles' mainloops; a split-K rank's K
        range may be empty: it zeroes them instead. Returns the advanced states and
        ``mma``, whose ACCUMULATE flag the loop carries."""
        mma.set(warpgroup.Field.ACCUMULATE, self.split_k > 1)
        if cutlass.const_expr(self.split_k > 1):
            frags.acc.fill(0.0)
        for kt in range(k_tiles):
            ring.consumer_wait(read_state)
            self.operands.begin_stage()
            for kb in cutlass.range_constexpr(self.operands.k_blocks(frags)):
                self.operands.gemm_k_block(mma, frags, kb, read_state.index, kt, tile)
                mma.set(warpgroup.Field.ACCUMULATE, True)
            self.operands.end_stage()
            if kt > 0:
                ring.consumer_release(free_state)
                free_state.advance()
            read_state.advance()
        return read_state, free_state, mma

    @cute.jit
    def release_last_stage(self, ring, free_state, k_tiles):
        """Release the tile's last ring stage (all its WGMMAs have completed). Returns the
        advanced state and, with epilogue math, the zero that the epilogue's copies add
        (``ptx.zero_after_release``; None otherwise)."""
        released = None
        if cutlass.const_expr(self.epilogue_math):
            released = cutlass.Float32(0.0)
        if k_tiles > 0:
            ring.consumer_release(free_state)
            if cutlass.const_expr(self.epilogue_math):
                released = zero_after_release(ring.consumer_get_barrier(free_state))
            free_state.advance()
        return free_state, released
