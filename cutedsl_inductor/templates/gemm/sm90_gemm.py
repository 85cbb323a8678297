"""Persistent, warp-specialized Hopper (sm_90a) GEMM written in CuTe DSL.

What it computes
----------------
For every batch index ``l``::

    C[:, :, l] = cast( alpha * (A[:, :, l] @ B[:, :, l]^T) + beta * Bias[:, :, l] )

with the accumulation in fp32 and the epilogue math in fp32.  With ``swiglu="b"``
there are two weights, B (the gate) and B_up, of one shape and layout, and no bias::

    C[:, :, l] = cast( silu(A[:, :, l] @ B[:, :, l]^T) * (A[:, :, l] @ B_up[:, :, l]^T) )

the SwiGLU of an LLM MLP in one kernel: each stage loads A's tile once and both
weights' tiles, each warpgroup keeps one accumulator per weight (same layout, so value
i of one pairs with value i of the other), and the epilogue combines them before the
fusion hook sees the value.  Where the two weight tiles of a stage, side by side in
smem, make one tile twice as wide (a K-major weight whose K tile is at most 64, an
N-major one at least 64 wide; at most 256 together), one WGMMA of that width computes
both accumulators, as the two halves of one, and A's tile is read once per k-block
instead of twice.  ``swiglu="a"`` is the same with the two weights in A's
place (``silu(A @ B^T) * (A_up @ B^T)``): the swap-AB form, C^T = W X^T, for small M.

Tensor convention (all three are rank-3 CuTe tensors, batch mode last):

* ``A`` has shape ``(M, K, L)``.  Either K-major (stride ``(lda, 1, batch)``,
  i.e. a row-major ``M x K`` torch matrix) or M-major (stride ``(1, lda,
  batch)``, i.e. the ``(M, K)`` view of a row-major ``K x M`` matrix).
* ``B`` has shape ``(N, K, L)``.  Either K-major (stride ``(ldb, 1, batch)``,
  i.e. torch ``b.t()`` for a column-major / transposed ``K x N`` weight, or an
  ``nn.Linear`` weight as stored) or N-major (stride ``(1, ldb, batch)``: the
  ``(N, K)`` view ``b.mT`` of an ordinary row-major ``K x N`` torch matrix).
  So torch ``a @ b`` (``b`` of shape ``(K, N)``) is ``A = a``, ``B = b.mT``.
* ``C`` has shape ``(M, N, L)``, row-major: stride ``(ldc, 1, batch)``; with
  ``store="direct"`` also column-major, stride ``(1, ldc, batch)``: the
  transposed view of a row-major torch output, as a caller that swaps A and B
  (``C^T = B A^T``, the weight in the WGMMA's M mode where torch's M is small)
  passes it.
* ``Bias`` (optional, ``None`` = no bias) is any ``(M, N, L)`` view with
  arbitrary strides; a stride of 0 expresses broadcasting.  The addmm vector
  bias of shape ``(N,)`` is the view with strides ``(0, 1, 0)``.  It is read
  at coordinates clamped into the problem, two columns per vector load only
  where its strides and base prove that aligned (else element by element), so
  it needs no alignment.

Design
------
* One CTA = 1 producer warpgroup (warp 0 issues TMA loads, the other three
  warps idle with a minimal register budget) + 1 or 2 consumer warpgroups
  issuing WGMMA (``cooperative=True``: two warpgroups share one
  ``tile_m x tile_n`` tile, split along M; ``cooperative=False``: one
  warpgroup owns the whole tile).
* Ping-pong (``pingpong=True``, with ``cooperative=False``): two consumer
  warpgroups, each owning whole ``tile_m x tile_n`` tiles, take alternate
  tiles of the CTA's persistent walk (warpgroup 0 the 1st, 3rd, ...;
  warpgroup 1 the 2nd, 4th, ...), so one warpgroup's epilogue overlaps the
  other's mainloop.  The producer is unchanged: it loads the CTA's tiles in
  walk order into the one ring, and every stage is consumed (and released)
  by one warpgroup (the ring's consumer count is one warpgroup); each
  consumer advances its pipeline states past the ``k_tiles`` stages of the
  other's tile.  Two named barriers hand the mainloop turn over in tile
  order (a warpgroup waits for its turn before its first k-stage wait and
  passes it on once its last WGMMA is issued); this is also what keeps a
  warpgroup from waiting on a ring slot more than one phase ahead of the
  producer.  The epilogues need no ordering: each warpgroup has its own
  smem store buffers, named barrier, TMA-store warp (its first warp) and
  bulk-group accounting.
* Operands travel gmem -> smem by TMA (``cp.async.bulk.tensor``) into a
  ``stages``-deep ring guarded by a PipelineTmaAsync (full/empty mbarriers).
  With a cluster, A is multicast across the ``cluster_n`` CTAs that share
  an M tile and B across the ``cluster_m`` CTAs that share an N tile.  The
  loads of an operand whose tiles only one cluster reads (B where M fits one
  cluster's tiles: the weight at small M), if it is at most 256 MB, carry an
  evict-first L2 policy, the others and the C stores evict-normal
  (:meth:`Sm90Gemm.stream_policy`).  A tile's first WGMMAs overwrite the
  accumulator (the accumulate flag off; K >= 1) instead of it being zeroed
  per tile; a split-K rank, whose K range may be empty, zeroes it.
* Persistent static scheduler: ``grid = (cluster_m, cluster_n,
  min(#clusters of tiles, max_active_clusters))``; each cluster walks the
  linearised (M-tiles, N-tiles, L) space with stride = #launched clusters.
  ``raster="m"`` walks M fastest inside bands of ``group_size`` M-clusters
  (L2 reuse of B); ``raster="n"`` walks N fastest inside bands of
  ``group_size`` N-clusters (L2 reuse of A).
* Epilogue, one ``epi_tile`` sub-tile (64 rows per warpgroup of the tile x
  32 columns; 16 fp32 values per thread) at a time: copy the sub-tile's
  accumulator values into a register fragment -> :meth:`Sm90Gemm.epilogue_op`
  on the copy (alpha, bias, beta; the fusion hook; an alpha or beta that
  :meth:`Sm90Gemm.launch` gets as the Python number 1, as the template passes
  its ALPHA and BETA, costs no multiply) -> cast -> swizzled smem
  (stmatrix) -> TMA store (``store="tma"``, default).  With
  ``store="direct"`` the same happens for 16-value chunks of the fragment
  (the whole 8-value fragment of a 64x16 tile),
  followed by predicated per-element stores from registers.  The
  accumulator itself is never written outside the WGMMAs: in-place epilogue
  math on it (even ``acc[i] = acc[i] * 2``) changed the mainloop ptxas
  got (unrolled 3x, a ``warpgroup.arrive`` injected per WGMMA batch:
  C7519) or, written in a divergent branch, made ptxas serialize the WGMMAs
  altogether (C7520); fused epilogues were 5-15% slower on H200, ping-pong
  included.  The copy goes through an opaque inline-asm ``mov``
  (``_opaque_copy``): with a plain copy LLVM coalesces a hook's result that
  is written in a divergent branch (``if n < prob_n: v += bias[n]``) back
  into the accumulator's register.  Where there is epilogue math (a fusion
  hook, SwiGLU), the copy also adds a zero derived from the tile's last ring
  slot's barrier once that slot is released (``_zero_after_release``): ptxas would
  otherwise compute the whole tile's epilogue before that release.  Split-K:
  the DSMEM reduction sums a CTA's own units into ``acc`` (after the last
  WGMMA of the tile); the sum then takes the same per-sub-tile path.  The
  TMA loads zero-fill the M/N/K tails exactly.  The TMA store clips rows (M)
  exactly but the contiguous N tail only to 16-byte granularity (measured on
  H200: with N=257 bf16 it rewrote columns 257..263 of each row); hence
  ``store="tma"`` requires ``N * sizeof(C) % 16 == 0`` (declared in the
  compiled signature, so other N are rejected at call time) and
  ``store="direct"`` serves any N.
* Tile input (``launch(mTile=...)``: an epilogue input laid out like C, e.g. a
  residual): the store warp TMA-loads its sub-tiles into the store buffers, up to
  ``epi_stages - 1`` sub-tiles ahead of the one being stored (across tile boundaries),
  each into the buffer of the store before, once that store has been read
  (``cp.async.bulk.wait_group.read``), completing on that buffer's mbarrier; the
  consumers read it with ldmatrix in the layout stmatrix then overwrites
  (:meth:`Sm90Gemm.epilogue_tile_input`).  Unlike loads into registers, these are not
  held by each sub-tile's proxy fence (MEMBAR.ALL.CTA).
* Split-K (``split_k`` > 1, for small M whose output tiles cannot fill the
  SMs): each of a cluster's ``cluster_m x cluster_n`` output tiles is owned
  by ``split_k`` CTAs of the cluster (``cluster_m * cluster_n * split_k`` <=
  8 CTAs; x = m + cluster_m * r, y = n); the CTA of split rank r runs the
  mainloop over its own contiguous, balanced range of K tiles (empty when K
  has fewer tiles than ``split_k``: its partial sum is then zero), with TMA
  multicast among the CTAs of the same rank, as without split-K.  No workspace, no atomics: each
  CTA has a dedicated fp32 reduction buffer in smem (one accumulator tile;
  the ring cannot serve, the producer already prefetches the next tile
  into it).  Reduce-scatter: every CTA writes its fragment into its own
  buffer and arrives (release, cluster scope) on each peer's "ready"
  mbarrier; epilogue unit u (the fragment's values [16u, 16u + 16): one
  store sub-tile) belongs to rank u % split_k, which waits on its "ready",
  adds the peers' values of its units into ``acc`` through DSMEM
  (``ld.shared::cluster``, same per-thread fragment layout) and arrives on
  each peer's "free" mbarrier; a CTA waits on its "free" before it rewrites
  its buffer for the next tile and before it exits.  Each CTA then runs
  ``epilogue_op`` and the store for its own units only, so the hook sees
  each full sum exactly once, and the reduction's DSMEM reads and the
  epilogue are spread over the cluster.  The persistent walk and the
  cluster's tile sequence are those of the unsplit kernel.

Invariants / requirements (checked by :meth:`Sm90Gemm.can_implement`)
---------------------------------------------------------------------
* A, B: both bf16 or both fp16.  C: bf16, fp16 or fp32.  Accumulator fp32.
* Every non-unit stride of A, B and C (leading dimension and batch stride)
  is a multiple of 16 bytes (8 elements for 16-bit, 4 for fp32) and the base
  pointers are 16-byte aligned: TMA's rules (for L == 1 the batch stride is
  unused but must still satisfy the declared divisibility; pass e.g. M*lda).
  Sizes M, K, L are free (tails handled); N too with ``store="direct"``;
  M, N, K >= 1.  ``make_fake_gemm_args`` declares exactly these contracts
  with ``cute.sym_int32/sym_int64(divisibility=...)``.

* ``split_k`` in ``SPLIT_K_CHOICES``; > 1 only without ping-pong, with
  ``cluster_m * cluster_n * split_k <= 8`` CTAs per cluster, and if two
  stages still fit next to the reduction buffer (``tile_m * tile_n * 4``
  bytes; so not with a 128x256 or 256x128 tile).

Failure semantics: invalid constructor parameters raise ``ValueError``
immediately; unsupported dtypes/layouts found while tracing ``__call__``
raise ``ValueError`` before any MLIR is emitted.  Call
:meth:`Sm90Gemm.can_implement` (or :meth:`Sm90Gemm.why_not`) up front to
avoid both.

Fusing more pointwise work
--------------------------
Subclass and override :meth:`Sm90Gemm.epilogue_op`.  It is called once per
epilogue sub-tile (per 16-value chunk with ``store="direct"``) with one
thread's fp32 register fragment of it (a copy of the accumulator values,
modified in place), a same-shaped tensor of their global ``(m, n)``
coordinates, the batch index, the problem bounds and the ``epi_args``
pass-through value given to ``__call__`` (e.g. a tuple of extra tensors).
Everything before the cast to the output dtype happens there.  Write
pointwise code indexed by ``i`` over ``cute.size(frag)``: the fragment's
shape and the number of calls per tile are the kernel's business.  Global
loads go in :meth:`Sm90Gemm.epilogue_prefetch` (called with the same
coordinates one sub-tile earlier; what it returns reaches ``epilogue_op`` as
``prefetched``): without split-K the kernel issues them while it stores the
previous sub-tile (the first sub-tile's while the last WGMMAs run), so their
latency is not paid once per sub-tile.  On the H200 at 8192x4096x4096 the
prefetch took a per-column bias from 1.03x to 1.01x of the plain GEMM's
time (cooperative 128x256; ``benchmarks/epilogue_cost.py``).  An L2
warm-up of the tile's inputs when the tile starts was measured too, and
dropped: a residual's cost rose from 1.07x to 1.08x.
"""

from __future__ import annotations

from typing import Any, Optional

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass._mlir.dialects import llvm, nvvm
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.memory import SmemAllocator
from cutlass.tensor_utils import LayoutEnum

__all__ = [
    "Sm90Gemm",
    "DEFAULT_CONFIGS",
    "pick_configs",
    "swiglu_configs",
    "config_name",
    "make_fake_gemm_args",
    "compile_sm90_gemm",
    "SM90_SMEM_CAPACITY",
]

# Usable dynamic shared memory per CTA on sm_90 (227 KiB).
SM90_SMEM_CAPACITY = 227 * 1024
# Reserved for mbarriers + alignment padding of the smem carve-out.
_SMEM_RESERVED = 1024 + 256
_THREADS_PER_WG = 128
_MAX_CLUSTER_CTAS = 8  # the portable cluster size
_MAX_ACC_REGS = 192  # fp32 accumulator registers per consumer thread (of 232)
# Accumulator values per thread in one epilogue unit (a TMA-store sub-tile of
# ``epi_tile`` or a direct-store chunk) where the fragment has at least that many.
_EPI_UNIT = 16
_DEFAULT_NUM_SMS = 132  # H100 SXM / H200
SPLIT_K_CHOICES = (1, 2, 4, 8)  # 8 = the portable maximum cluster size
DEFAULT_GROUP_SIZE = 8  # clusters per band of the swizzled raster
# 224: 14336 / 224 = 64 tiles, so two M tiles of 64 make 128 CTAs (of 132 SMs), not 112.
# 96: SwiGLU's two-weight kernel with the accumulators of a 256x192 GEMM tile.  On the
# H200 (bf16, gemm_sweep.py --swiglu --rounds 5, nt, of two cuBLAS GEMMs), 256x96 c1x2
# against the best offered before: 8192x128256x4096 0.99 / 0.97, 8192x14336x4096
# 1.04 / 1.00, 1024x128256x4096 1.08 / 1.05, 8192x4096x14336 1.00 / 0.98.
_TILE_N_CHOICES = (16, 32, 64, 96, 128, 192, 224, 256)
# L2 eviction priorities for the TMA copies' cache-policy operand (the encodings of
# createpolicy.fractional.L2::evict_normal / evict_first with fraction 1).  Without one
# the DSL passes 0, which is no policy createpolicy makes.
_EVICT_NORMAL = 0x1000000000000000
_EVICT_FIRST = 0x12F0000000000000
# The largest operand (bytes, all batches) loaded evict-first: on the H200 it paid for
# 32 MB and 117 MB weights and cost 2-5% for a 1 GB one (128256 x 4096; see
# Sm90Gemm.stream_policy).  Between the two, untested.
_EVICT_FIRST_MAX_BYTES = 256 * 1024 * 1024

_DTYPE_ALIASES = {
    "bf16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16", "BFloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "torch.float16": "fp16",
    "Float16": "fp16",
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "torch.float32": "fp32",
    "Float32": "fp32",
}
_DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
_CUTLASS_DTYPES = {"bf16": cutlass.BFloat16, "fp16": cutlass.Float16, "fp32": cutlass.Float32}


def _dtype_key(dt: Any) -> Optional[str]:
    """Normalise a torch dtype / cutlass Numeric type / string to 'bf16'|'fp16'|'fp32'."""
    if dt is None:
        return None
    if isinstance(dt, str):
        return _DTYPE_ALIASES.get(dt)
    name = getattr(dt, "__name__", None)
    if name in _DTYPE_ALIASES:
        return _DTYPE_ALIASES[name]
    return _DTYPE_ALIASES.get(str(dt))


def _operand_tiles(swiglu: str) -> tuple[int, int]:
    """(A tiles, B tiles) per pipeline stage: two of the operand that holds two weights."""
    return (2 if swiglu == "a" else 1), (2 if swiglu == "b" else 1)


def _ceil_div(a: int, b: int) -> int:
    return (a + b - 1) // b


def _opaque_copy(x, zero=None):
    """``x`` (fp32) through inline asm: a new value that LLVM cannot see through.  The
    epilogue copies the accumulator with it; with a plain copy LLVM would fold the copy
    away and, where a fusion hook writes its fragment in a divergent branch, coalesce
    the branch's result back into the WGMMA accumulator register -- which makes ptxas
    serialize the WGMMAs (C7519/C7520).  With ``zero`` (a :func:`_zero_after_release`)
    the copy is ``x + zero``: it, and all math on it, cannot start before that read."""
    if zero is None:
        return cutlass.Float32(llvm.inline_asm(
            cutlass.Float32.mlir_type, [cutlass.Float32(x).ir_value()], "mov.b32 $0, $1;",
            "=f,f", has_side_effects=False, is_align_stack=False,
            asm_dialect=llvm.AsmDialect.AD_ATT))
    return cutlass.Float32(llvm.inline_asm(
        cutlass.Float32.mlir_type,
        [cutlass.Float32(x).ir_value(), cutlass.Float32(zero).ir_value()],
        "add.f32 $0, $1, $2;", "=f,f,f", has_side_effects=False, is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT))


def _zero_after_release(slot_barrier):
    """+0.0, computed from a non-blocking ``mbarrier.test_wait`` on ``slot_barrier`` (the
    ring slot's empty barrier, just arrived on): 0 or 1 times 0.  ptxas keeps that
    mbarrier operation after the arrive and cannot fold the product, so an epilogue
    value copied with it cannot be computed before the slot's release.  Without it
    ptxas hoists a fused epilogue's register-only math (all sub-tiles of it, across the
    store barriers) above the conditional arrive that frees the tile's last ring slot:
    the producer then waits on that slot for the whole epilogue (H200, 8192x4096x4096
    ping-pong 128x128, ``gelu(x @ w.T)``: 1.13-1.15x the plain GEMM's time, 1.05-1.07x
    with the zero)."""
    return cutlass.Float32(llvm.inline_asm(
        cutlass.Float32.mlir_type, [slot_barrier.toint().ir_value()],
        "{ .reg .pred p; .reg .b32 t; mbarrier.test_wait.parity.shared::cta.b64 p, [$1], 0; "
        "selp.b32 t, 1, 0, p; cvt.rn.f32.u32 $0, t; mul.rn.f32 $0, $0, 0f00000000; }",
        "=f,r", has_side_effects=True, is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT))


def _split_k_clusters(num_sms: int, cluster_ctas: int) -> int:
    """Persistent split-K clusters assumed co-resident.  A cluster must fit in one GPC
    (16-18 SMs on H100/H200), so clusters of 4 or 8 CTAs strand a few SMs per GPC;
    launching more clusters than fit would run the excess as a late second wave.  The
    H200's occupancy query agrees: 66, 30 and 15 active clusters of 2, 4 and 8 CTAs
    (benchmarks/gemm_splitk_check.py)."""
    if cluster_ctas <= 2:
        return max(1, num_sms // cluster_ctas)
    return max(1, num_sms * 15 // 16 // cluster_ctas)


class Sm90Gemm:
    """Persistent warp-specialized TMA + WGMMA GEMM for sm_90a.

    Constructor parameters are compile-time constants:

    :param tile_m: CTA tile M.  64 or 128 with ``cooperative=False``; 128 or
        256 with ``cooperative=True``.
    :param tile_n: CTA tile N: 64, 96, 128, 192, 224 or 256; 16 or 32 with
        ``store="direct"``.
    :param tile_k: CTA tile K (one pipeline stage): 32, 64 or 128.
    :param cluster_m: CTAs per cluster along M (1 or 2); B is multicast.
    :param cluster_n: CTAs per cluster along N (1 or 2); A is multicast.
    :param stages: smem ring depth; 0 = as many as fit (at most 8).
    :param raster: "m" or "n": the fast direction of the persistent walk.
    :param group_size: band width (in clusters) of the swizzled raster.
    :param cooperative: two consumer warpgroups per tile (True) or one.
    :param pingpong: two consumer warpgroups, each owning whole tiles and
        taking alternate tiles of the CTA's walk, so that one's epilogue
        overlaps the other's mainloop.  Needs ``cooperative=False``; tile_m
        64 or 128 (per warpgroup).
    :param swiglu: "" (a GEMM), "b" (two weights: ``silu(A @ B^T) * (A @ B_up^T)``)
        or "a" (``silu(A @ B^T) * (A_up @ B^T)``); see the module docstring.  No
        split-K, no bias; both accumulators count towards the register limit below.
    :param acc_dtype: accumulator type; only ``cutlass.Float32``.
    :param max_active_clusters: persistent grid cap; default
        ``num_sms // (cluster_m * cluster_n)`` (split-K: ``num_sms // split_k``,
        less a margin for clusters of 4 or 8 that cannot use every SM of a GPC).
    :param num_sms: SM count used for the default above (132 for H100/H200).
    :param split_k: CTAs per cluster that share one output tile, each
        accumulating a contiguous range of K tiles; their fp32 partial sums
        are reduced through distributed shared memory, each CTA summing
        and storing its share of the tile's epilogue sub-tiles.  One of
        ``SPLIT_K_CHOICES``; > 1 needs ``cluster_m * cluster_n * split_k <= 8``
        and a ``tile_m * tile_n * 4``-byte smem reduction buffer (fewer stages).
    :param store: epilogue store path.  "tma" (default, fast): smem + TMA
        store; needs ``N * sizeof(C)`` to be a multiple of 16 bytes, because
        the TMA store clips the N tail only to 16-byte granularity (it would
        overwrite up to 15 bytes past column N).  The compiled function
        enforces it (N is declared divisible by 16/sizeof(C)).  "direct":
        predicated per-element stores from registers, any N, slower epilogue.

    The per-thread accumulator is limited to 128 fp32 registers:
    ``tile_m * tile_n * (2 with swiglu else 1) <= 128 * 128 * (#consumer warpgroups
    sharing a tile)``.
    """

    def __init__(
        self,
        tile_m: int = 128,
        tile_n: int = 128,
        tile_k: int = 64,
        cluster_m: int = 1,
        cluster_n: int = 1,
        stages: int = 0,
        raster: str = "m",
        group_size: int = DEFAULT_GROUP_SIZE,
        cooperative: bool = True,
        acc_dtype: Any = cutlass.Float32,
        max_active_clusters: Optional[int] = None,
        num_sms: int = _DEFAULT_NUM_SMS,
        store: str = "tma",
        split_k: int = 1,
        pingpong: bool = False,
        swiglu: str = "",
    ):
        err = self.config_error(
            tile_m=tile_m, tile_n=tile_n, tile_k=tile_k, cluster_m=cluster_m,
            cluster_n=cluster_n, stages=stages, raster=raster,
            group_size=group_size, cooperative=cooperative, acc_dtype=acc_dtype,
            store=store, split_k=split_k, pingpong=pingpong, swiglu=swiglu,
        )
        if err is not None:
            raise ValueError(f"Sm90Gemm: {err}")
        self.tile_m, self.tile_n, self.tile_k = int(tile_m), int(tile_n), int(tile_k)
        self.cluster_m, self.cluster_n = int(cluster_m), int(cluster_n)
        self.cluster_size = self.cluster_m * self.cluster_n
        self.requested_stages = int(stages)
        self.raster = raster
        self.group_size = int(group_size)
        self.cooperative = bool(cooperative)
        self.pingpong = bool(pingpong)
        self.store = store
        self.split_k = int(split_k)
        self.swiglu = swiglu
        # Math between the accumulator and the store (a fusion hook, or SwiGLU's) starts
        # only once the tile's last ring slot is released (see _zero_after_release).
        self.epilogue_math = swiglu != "" or type(self).epilogue_op is not Sm90Gemm.epilogue_op
        # Tiles of A and of B per pipeline stage: the operand with two weights has two.
        self.a_tiles, self.b_tiles = _operand_tiles(swiglu)
        self.acc_dtype = cutlass.Float32
        if max_active_clusters is None:
            max_active_clusters = (_split_k_clusters(int(num_sms),
                                                     self.cluster_size * self.split_k)
                                   if self.split_k > 1
                                   else max(1, int(num_sms) // self.cluster_size))
        if int(max_active_clusters) < 1:
            raise ValueError("Sm90Gemm: max_active_clusters must be >= 1")
        self.max_active_clusters = int(max_active_clusters)

        self.num_consumer_wgs = 2 if self.cooperative or self.pingpong else 1
        self.num_consumer_threads = self.num_consumer_wgs * _THREADS_PER_WG
        self.num_threads = _THREADS_PER_WG + self.num_consumer_threads
        # Consumer warpgroups that share one tile (stacked along M), and the
        # threads that consume each pipeline stage and store each tile.
        self.tile_wgs = 2 if self.cooperative else 1
        self.tile_threads = self.tile_wgs * _THREADS_PER_WG
        self.mma_atom_layout = (self.tile_wgs, 1, 1)
        # Epilogue sub-tile: rows covered by one M-repetition of the tiled MMA
        # (64 per consumer warpgroup of the tile) x 32 columns.
        self.epi_tile = (64 * self.tile_wgs, 32)
        # Accumulator values per thread in one epilogue unit (a TMA-store sub-tile or a
        # direct-store chunk): the fragment's values [u * epi_unit, (u + 1) * epi_unit).
        # Fewer than 16 only where the whole fragment is (tile_n = 16 with tile_m = 64).
        self.epi_unit = min(_EPI_UNIT, self.tile_m * self.tile_n
                            // (_THREADS_PER_WG * self.tile_wgs))
        self.producer_regs = 40
        self.consumer_regs = 232
        self.store_warp = 4  # first consumer warp issues the TMA stores

    # ------------------------------------------------------------------ checks
    @staticmethod
    def config_error(
        tile_m: int = 128, tile_n: int = 128, tile_k: int = 64, cluster_m: int = 1,
        cluster_n: int = 1, stages: int = 0, raster: str = "m",
        group_size: int = DEFAULT_GROUP_SIZE,
        cooperative: bool = True, acc_dtype: Any = cutlass.Float32, store: str = "tma",
        split_k: int = 1, pingpong: bool = False, swiglu: str = "", **_unused: Any,
    ) -> Optional[str]:
        """Return why a kernel configuration is invalid, or None if it is valid."""
        if store not in ("tma", "direct"):
            return f"store={store!r} must be 'tma' or 'direct'"
        if split_k not in SPLIT_K_CHOICES:
            return f"split_k={split_k} not in {SPLIT_K_CHOICES}"
        if cluster_m * cluster_n * split_k > _MAX_CLUSTER_CTAS:
            return (f"cluster_m * cluster_n * split_k = {cluster_m * cluster_n * split_k} "
                    f"CTAs per cluster (the cluster holds the K split), more than "
                    f"{_MAX_CLUSTER_CTAS}")
        if _dtype_key(acc_dtype) != "fp32":
            return f"acc_dtype must be Float32, got {acc_dtype}"
        if pingpong and cooperative:
            return "pingpong=True needs cooperative=False (each warpgroup owns its tiles)"
        if pingpong and split_k > 1:
            return f"split_k={split_k} needs pingpong=False"
        wgs = 2 if cooperative else 1
        allowed_m = (128, 256) if cooperative else (64, 128)
        if tile_m not in allowed_m:
            return f"tile_m={tile_m} not in {allowed_m} (cooperative={cooperative})"
        if tile_n not in _TILE_N_CHOICES:
            return f"tile_n={tile_n} not in {_TILE_N_CHOICES}"
        if tile_n < 64 and store != "direct":
            return (f"tile_n={tile_n} needs store='direct' (the TMA store's sub-tile is "
                    "32 columns of a tile of at least 64)")
        if tile_k not in (32, 64, 128):
            return f"tile_k={tile_k} not in (32, 64, 128)"
        if swiglu not in ("", "a", "b"):
            return f"swiglu={swiglu!r} must be '', 'a' or 'b'"
        if swiglu and split_k > 1:
            return f"split_k={split_k} needs swiglu=''"
        a_tiles, b_tiles = _operand_tiles(swiglu)
        if tile_m * tile_n * max(a_tiles, b_tiles) > _MAX_ACC_REGS * 128 * wgs:
            what = "two accumulators of a " if swiglu else ""
            return (f"{what}tile {tile_m}x{tile_n} need(s) more than {_MAX_ACC_REGS} "
                    f"accumulator registers per thread with {wgs} consumer warpgroup(s)")
        if cluster_m not in (1, 2) or cluster_n not in (1, 2):
            return f"cluster ({cluster_m},{cluster_n}) must have entries in (1, 2)"
        if raster not in ("m", "n"):
            return f"raster={raster!r} must be 'm' or 'n'"
        if int(group_size) < 1:
            return f"group_size={group_size} must be >= 1"
        if stages != 0 and stages < 2:
            return f"stages={stages} must be 0 (auto) or >= 2"
        # smem feasibility with the widest supported output (fp32); ping-pong
        # keeps one epilogue buffer per consumer warpgroup.
        epi_wgs = 2 if pingpong else wgs
        if Sm90Gemm._num_stages(tile_m, tile_n, tile_k, 2, 4, epi_wgs, stages, split_k,
                                a_tiles, b_tiles) < 2:
            extra = " next to the split-K reduction buffer" if split_k > 1 else ""
            return f"tile does not fit two pipeline stages in shared memory{extra}"
        return None

    @staticmethod
    def _epi_bytes(c_bytes: int, wgs: int) -> int:
        epi_stages = 4 if c_bytes <= 2 else 2
        return 64 * wgs * 32 * c_bytes * epi_stages

    @staticmethod
    def _reduce_bytes(tile_m: int, tile_n: int, split_k: int) -> int:
        """The split-K reduction buffer: one fp32 accumulator tile (none without split)."""
        return tile_m * tile_n * 4 if split_k > 1 else 0

    @staticmethod
    def _num_stages(tile_m: int, tile_n: int, tile_k: int, ab_bytes: int,
                    c_bytes: int, wgs: int, requested: int, split_k: int = 1,
                    a_tiles: int = 1, b_tiles: int = 1) -> int:
        per_stage = (tile_m * a_tiles + tile_n * b_tiles) * tile_k * ab_bytes
        budget = (SM90_SMEM_CAPACITY - _SMEM_RESERVED - Sm90Gemm._epi_bytes(c_bytes, wgs)
                  - Sm90Gemm._reduce_bytes(tile_m, tile_n, split_k))
        fit = budget // per_stage
        if requested:
            return requested if requested <= fit else 0
        return min(fit, 8)

    def ring_stages(self, ab_bytes: int, c_bytes: int) -> int:
        """The smem ring depth of this config for these operand and output widths
        (0 when a requested depth does not fit)."""
        return self._num_stages(self.tile_m, self.tile_n, self.tile_k, ab_bytes, c_bytes,
                                self.num_consumer_wgs, self.requested_stages, self.split_k,
                                self.a_tiles, self.b_tiles)

    @staticmethod
    def why_not(
        a_dtype: Any, b_dtype: Any, out_dtype: Any, a_major: str, b_major: str,
        m: int, n: int, k: int, l: int = 1, bias_dtype: Any = None,
        lda: Optional[int] = None, ldb: Optional[int] = None,
        ldc: Optional[int] = None, batch_strides: Optional[tuple] = None,
        config: Optional[dict] = None,
    ) -> Optional[str]:
        """Return why a problem cannot run on this kernel, or None if it can.

        ``a_major`` is "k" (row-major A) or "m"; ``b_major`` is "k" or "n" (see
        the module docstring).  ``lda/ldb/ldc`` are the non-unit leading strides
        in elements (default: the compact value), ``batch_strides`` the
        (A, B, C) batch strides in elements (default compact; ignored if l==1).
        ``config`` (a dict of constructor kwargs) is validated too if given.
        """
        ak, bk, ck = _dtype_key(a_dtype), _dtype_key(b_dtype), _dtype_key(out_dtype)
        if ak not in ("bf16", "fp16") or ak != bk:
            return f"A/B dtypes must both be bf16 or both fp16 (got {a_dtype}, {b_dtype})"
        if ck not in ("bf16", "fp16", "fp32"):
            return f"output dtype {out_dtype} unsupported"
        if bias_dtype is not None and _dtype_key(bias_dtype) is None:
            return f"bias dtype {bias_dtype} unsupported"
        if a_major not in ("k", "m"):
            return f"a_major must be 'k' or 'm', got {a_major!r}"
        if b_major not in ("k", "n"):
            return f"b_major must be 'k' or 'n', got {b_major!r}"
        for name, v in (("m", m), ("n", n), ("k", k), ("l", l)):
            if int(v) < 1:
                return f"{name}={v} must be >= 1"
            if int(v) >= 2**31:
                return f"{name}={v} too large for int32 indexing"
        ab = _DTYPE_BYTES[ak]
        cb = _DTYPE_BYTES[ck]
        lda = lda if lda is not None else (k if a_major == "k" else m)
        ldb = ldb if ldb is not None else (k if b_major == "k" else n)
        ldc = ldc if ldc is not None else n
        for name, ld, eb in (("lda", lda, ab), ("ldb", ldb, ab), ("ldc", ldc, cb)):
            if (ld * eb) % 16:
                return f"{name}={ld} elements is not a multiple of 16 bytes (TMA)"
        if l > 1:
            bs = batch_strides or (m * k, n * k, m * n)
            for name, s, eb in zip(("A", "B", "C"), bs, (ab, ab, cb)):
                if (int(s) * eb) % 16:
                    return f"batch stride of {name} ({s}) is not a multiple of 16 bytes"
        if config is not None:
            err = Sm90Gemm.config_error(**config)
            if err is not None:
                return err
            if config.get("store", "tma") == "tma" and (n * cb) % 16:
                return (f"n={n} is not a multiple of {16 // cb}: the TMA-store epilogue "
                        "needs 16-byte rows; use store='direct'")
        return None

    @staticmethod
    def can_implement(*args: Any, **kwargs: Any) -> bool:
        """``why_not(...) is None``; same arguments as :meth:`why_not`."""
        return Sm90Gemm.why_not(*args, **kwargs) is None

    # -------------------------------------------------------- trace-time setup
    def _setup(self, a_dtype, b_dtype, c_dtype, a_layout, b_layout, c_layout):
        if a_dtype not in (cutlass.BFloat16, cutlass.Float16) or a_dtype != b_dtype:
            raise ValueError(f"Sm90Gemm: A/B must both be bf16 or fp16, got {a_dtype}/{b_dtype}")
        if c_dtype not in (cutlass.BFloat16, cutlass.Float16, cutlass.Float32):
            raise ValueError(f"Sm90Gemm: unsupported output dtype {c_dtype}")
        if c_layout != LayoutEnum.ROW_MAJOR and self.store == "tma":
            raise ValueError("Sm90Gemm: C must be row-major (N contiguous) with store='tma'")
        self.a_dtype, self.b_dtype, self.c_dtype = a_dtype, b_dtype, c_dtype
        self.a_layout, self.b_layout = a_layout, b_layout
        c_bytes = c_dtype.width // 8
        self.stages = self.ring_stages(a_dtype.width // 8, c_bytes)
        if self.stages < 2:
            raise ValueError(
                f"Sm90Gemm: {self.requested_stages} stages of a {self.tile_m}x"
                f"{self.tile_n}x{self.tile_k} tile do not fit in shared memory")
        self.epi_stages = 4 if c_bytes <= 2 else 2

        self.tiled_mma = sm90_utils.make_trivial_tiled_mma(
            a_dtype, b_dtype, a_layout.sm90_mma_major_mode(),
            b_layout.sm90_mma_major_mode(), self.acc_dtype, self.mma_atom_layout,
            tiler_mn=(64, self.tile_n),
        )
        tile_mnk = (self.tile_m, self.tile_n, self.tile_k)
        # With swiglu the up projection's tile of ring stage s sits in its operand's
        # slot stages + s: one buffer, every slot at the swizzle's alignment.  Where the
        # two weight tiles of a stage, put side by side (slots 2s and 2s + 1), are the
        # smem layout of one tile twice as wide (``_wide_up_tile``), that is where they
        # go instead, and one WGMMA of that width computes both accumulators.
        self.wide_up = self.swiglu == "b" and self._wide_up_tile(b_layout, b_dtype)
        self.sA_layout = sm90_utils.make_smem_layout_a(a_layout, tile_mnk, a_dtype,
                                                       self.stages * self.a_tiles)
        self.sB_layout = sm90_utils.make_smem_layout_b(b_layout, tile_mnk, b_dtype,
                                                       self.stages * self.b_tiles)
        self.tiled_mma_up = self.tiled_mma
        self.sB_up_layout = self.sB_layout
        if self.wide_up:
            self.tiled_mma_up = sm90_utils.make_trivial_tiled_mma(
                a_dtype, b_dtype, a_layout.sm90_mma_major_mode(),
                b_layout.sm90_mma_major_mode(), self.acc_dtype, self.mma_atom_layout,
                tiler_mn=(64, 2 * self.tile_n),
            )
            self.sB_up_layout = sm90_utils.make_smem_layout_b(
                b_layout, (self.tile_m, 2 * self.tile_n, self.tile_k), b_dtype, self.stages)
        # Ping-pong: each consumer warpgroup has its own epi_stages buffers.
        epi_groups = self.num_consumer_wgs // self.tile_wgs
        self.sC_layout = sm90_utils.make_smem_layout_epi(
            c_dtype, LayoutEnum.ROW_MAJOR, self.epi_tile, self.epi_stages * epi_groups)

    def _wide_up_tile(self, b_layout: Any, b_dtype: Any) -> bool:
        """Whether two (tile_n, tile_k) weight tiles in consecutive slots of the B
        layout are, element for element, one (2 tile_n, tile_k) tile of the same kind of
        layout, which one WGMMA of N = 2 tile_n (at most 256) can read.  K-major: the
        swizzle atom spans the whole tile_k (atoms tile N first, so a slot is tile_n
        rows in a row).  N-major: atoms tile K first, so a slot is whole 64-element
        column blocks; tile_n must fill the 128-byte swizzle atom at both widths."""
        row_bytes = b_dtype.width // 8
        if 2 * self.tile_n > 256:
            return False
        if b_layout.is_k_major_b():
            return self.tile_k * row_bytes <= 128
        return self.tile_n * row_bytes % 128 == 0

    # ------------------------------------------------------------- host entry
    @cute.jit
    def __call__(
        self,
        mA: cute.Tensor,
        mB: cute.Tensor,
        mC: cute.Tensor,
        mBias: Optional[cute.Tensor],
        alpha: cutlass.Float32,
        beta: cutlass.Float32,
        stream,
    ):
        """Launch ``C = alpha * A @ B^T + beta * Bias`` (see the module docstring).

        With the TVM-FFI ABI and an environment stream the compiled function is
        called as ``f(A, B, C, Bias_or_None, alpha, beta)``.
        """
        self.launch(mA, mB, mC, mBias, alpha, beta, stream)

    @cute.jit
    def launch(self, mA, mB, mC, mBias, alpha, beta, stream, epi_args=None, mA_up=None,
               mB_up=None, mTile=None):
        """Trace-time body of ``__call__``.  A fusing subclass defines its own
        ``__call__`` with extra tensor arguments and forwards them here as
        ``epi_args`` (any pytree of tensors/scalars); they reach
        :meth:`epilogue_op` unchanged.  ``mA_up`` / ``mB_up``: the second weight, with
        ``swiglu="a"`` / ``"b"`` (same shape and layout as ``mA`` / ``mB``; only then).
        ``mTile``: an epilogue input laid out like C (same shape, dtype and strides; a
        residual), loaded by TMA into the store buffers ahead of each sub-tile and handed
        to :meth:`epilogue_tile_input` (16-bit C, ``store="tma"``, no split-K)."""
        given = ("a" if mA_up is not None else "") + ("b" if mB_up is not None else "")
        if cutlass.const_expr(given != self.swiglu):
            raise ValueError(f"Sm90Gemm: swiglu={self.swiglu!r} was given the second "
                             f"weight(s) of {given!r}")
        if cutlass.const_expr(self.swiglu != "" and mBias is not None):
            raise ValueError("Sm90Gemm: swiglu takes no bias")
        # Python numbers (the template's ALPHA and BETA) are compile-time constants: a
        # factor of 1 then costs no multiply per value.  Float32 ones are runtime.
        self.alpha_value = alpha if isinstance(alpha, (int, float)) else None
        self.beta_value = beta if isinstance(beta, (int, float)) else None
        alpha, beta = cutlass.Float32(alpha), cutlass.Float32(beta)
        self._setup(
            mA.element_type, mB.element_type, mC.element_type,
            LayoutEnum.from_tensor(mA), LayoutEnum.from_tensor(mB),
            LayoutEnum.from_tensor(mC),
        )
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
        tma_up, t_up = None, None  # the up projection's operand, as A's or B's
        if cutlass.const_expr(self.swiglu == "a"):
            tma_up, t_up = cpasync.make_tiled_tma_atom(
                a_op, mA_up, cute.slice_(self.sA_layout, (None, None, 0)), (tm, tk),
                num_multicast=self.cluster_n)
        if cutlass.const_expr(self.swiglu == "b"):
            tma_up, t_up = cpasync.make_tiled_tma_atom(
                b_op, mB_up, cute.slice_(self.sB_layout, (None, None, 0)), (tn, tk),
                num_multicast=self.cluster_m)
        tma_c, tC = None, mC
        if cutlass.const_expr(self.store == "tma"):
            tma_c, tC = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileS2GOp(), mC,
                cute.slice_(self.sC_layout, (None, None, 0)), self.epi_tile)
        self.tile_input = mTile is not None
        tma_t, tT = None, None
        if cutlass.const_expr(self.tile_input):
            if cutlass.const_expr(self.store != "tma" or self.split_k > 1
                                  or mTile.element_type != mC.element_type
                                  or mC.element_type.width != 16):
                raise ValueError("Sm90Gemm: a tile input needs store='tma', no split-K and "
                                 "a 16-bit C of its own dtype")
            tma_t, tT = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileG2SOp(), mTile,
                cute.slice_(self.sC_layout, (None, None, 0)), self.epi_tile)

        prob_m = cute.size(mC, mode=[0])
        prob_n = cute.size(mC, mode=[1])
        prob_l = cute.size(mC, mode=[2])
        prob_k = cute.size(mA, mode=[1])
        clusters_m = ((prob_m + tm - 1) // tm + self.cluster_m - 1) // self.cluster_m
        clusters_n = ((prob_n + tn - 1) // tn + self.cluster_n - 1) // self.cluster_n
        total_clusters = clusters_m * clusters_n * prob_l
        k_tiles = (prob_k + tk - 1) // tk
        num_persistent = min(total_clusters, self.max_active_clusters)

        stages = self.stages
        c_smem_elems = cute.cosize(self.sC_layout) if self.store == "tma" else 8
        epi_buffers = cute.size(self.sC_layout, mode=[2]) if self.store == "tma" else 1
        reduce_elems = max(self._reduce_bytes(tm, tn, self.split_k) // 4, 4)

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

        self.smem_struct = GemmSmem

        self.kernel(
            tma_a, tA, tma_b, tB, tma_up, t_up, tma_c, tC, tma_t, tT, mBias, alpha, beta,
            epi_args, self.tiled_mma, self.tiled_mma_up,
            self.cluster_layout(),
            self.sA_layout, self.sB_layout, self.sB_up_layout, self.sC_layout,
            prob_m, prob_n, clusters_m, clusters_n, total_clusters, k_tiles,
        ).launch(
            # With split-K the cluster's x extent also holds the K split.
            grid=(self.cluster_m * self.split_k, self.cluster_n, num_persistent),
            block=[self.num_threads, 1, 1],
            cluster=(self.cluster_m * self.split_k, self.cluster_n, 1),
            min_blocks_per_mp=1,
            stream=stream,
        )

    def cluster_layout(self, vmnk: bool = False) -> cute.Layout:
        """CTA (m, n, split rank) -> its rank in the cluster: x = m + cluster_m * k
        (the launch's cluster x extent is ``cluster_m * split_k``), y = n.  With
        ``vmnk``: the same with a leading unit mode, the pipeline's (v, m, n, k) view."""
        shape = (self.cluster_m, self.cluster_n, self.split_k)
        stride = (1, self.cluster_m * self.split_k, self.cluster_m)
        if vmnk:
            return cute.make_layout((1, *shape), stride=(1, *stride))
        return cute.make_layout(shape, stride=stride)

    # -------------------------------------------------------------- scheduler
    @cute.jit
    def tile_of(self, linear, clusters_m, clusters_n, cta_m, cta_n):
        """Map a linear cluster-work index to this CTA's (m_tile, n_tile, l)."""
        per_batch = clusters_m * clusters_n
        l_idx = linear // per_batch
        rem = linear - l_idx * per_batch
        # bands of group_size clusters along the fast direction, walked across the other
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

    # -------------------------------------------------------------- epilogue
    @cute.jit
    def epilogue_prefetch(self, coords, l_idx, prob_m, prob_n, mBias, epi_args):
        """Fusion hook, load phase: issue the global loads that :meth:`epilogue_op`
        will need for the sub-tile at ``coords`` and return them (register fragments;
        any value, passed back as ``prefetched``) without using the data.

        The kernel calls it one sub-tile ahead (the first sub-tile's while the tile's
        last WGMMAs run), so the loads' latency hides behind the previous sub-tile's
        store instead of stalling every sub-tile.  Same coordinate rules as
        :meth:`epilogue_op`.  Default: the bias values, or None; with the TMA store
        (N even) and a unit column stride, two columns per load: values 2j and 2j + 1
        are columns n and n + 1, n even (the accumulator's layout), and the load is one
        vector load wherever the bias's other strides and base let the compiler prove
        it aligned.
        """
        bias = None
        if cutlass.const_expr(mBias is not None):
            size = cute.size(coords)
            bias = cute.make_rmem_tensor((size,), mBias.element_type)
            column_stride = mBias.layout.stride[1]
            if cutlass.const_expr(self.store == "tma" and cute.is_static(column_stride)
                                  and column_stride == 1):
                for j in cutlass.range(size // 2, unroll_full=True):
                    mn = coords[2 * j]
                    n = cute.assume(min(mn[1], prob_n - 2), divby=2)
                    offset = cute.crd2idx((min(mn[0], prob_m - 1), n, l_idx), mBias.layout)
                    pair = cute.make_tensor(mBias.iterator + offset,
                                            cute.make_layout(2)).load()
                    bias[2 * j] = pair[0]
                    bias[2 * j + 1] = pair[1]
            else:
                for i in cutlass.range(size, unroll_full=True):
                    mn = coords[i]
                    bias[i] = mBias[min(mn[0], prob_m - 1), min(mn[1], prob_n - 1), l_idx]
        return bias

    @cute.jit
    def epilogue_op(self, acc, coords, l_idx, prob_m, prob_n, mBias, alpha, beta, epi_args,
                    prefetched):
        """Fusion hook: transform one thread's fp32 fragment of a sub-tile in place.

        Called once per epilogue sub-tile (direct store: per 16-value chunk),
        ``acc`` being a register copy of the sub-tile's accumulator values
        (never the WGMMA accumulator itself): ``acc[i]`` holds
        ``(A @ B^T)[m, n, l_idx]`` for ``(m, n) = coords[i]``, ``coords`` a
        same-shaped tensor of global coordinates; ``prefetched`` is what
        :meth:`epilogue_prefetch` returned for these coordinates.  Every
        in-bounds ``(m, n)`` of the tile is seen exactly once.  Coordinates may
        lie outside ``(prob_m, prob_n)`` in tail tiles; those values are
        discarded by the store but must not fault: clamp the coordinates of any
        gmem access into the problem (branch-free, and equal loads can be
        shared) or predicate it.  Default: ``alpha * acc + beta * bias``, without the
        multiply by a factor that :meth:`launch` was given as the Python number 1.
        Override both hooks in a subclass (decorated with ``@cute.jit``) to fuse
        more pointwise work; ``epi_args`` is passed through from ``__call__``.
        """
        if cutlass.const_expr(mBias is None):
            if cutlass.const_expr(self.alpha_value != 1):
                acc.store(acc.load() * alpha)
        else:
            for i in cutlass.range(cute.size(acc), unroll_full=True):
                bias = prefetched[i].to(cutlass.Float32)
                acc[i] = (self._times(acc[i], alpha, self.alpha_value)
                          + self._times(bias, beta, self.beta_value))

    @staticmethod
    def stream_policy(readers, operand_bytes):
        """The L2 policy of an operand's TMA loads when ``readers`` clusters read each of
        its tiles: evict-first for a tile that one cluster reads (its multicast is one L2
        read) of an operand of at most ``_EVICT_FIRST_MAX_BYTES``, normal otherwise.  A
        weight that small-M tiles stream once then does not push reused lines, or a
        previous kernel's dirty ones, out of L2: on the H200 at 128x4096x4096 nn
        (do_bench, whose L2 flush leaves it dirty) 1.09 of cuBLAS against 0.91, at
        128x14336x4096 nn 1.08 against 0.99; 1.00 against 0.89 at 64x4096x4096 nn; at
        1024^3, 4096^3 and 8192x4096x4096 unchanged (normal).  The 1 GB weight of
        16x128256x4096 and 64x128256x4096 lost 2-5% with it."""
        streamed = (readers == 1) & (operand_bytes <= _EVICT_FIRST_MAX_BYTES)
        return cutlass.Int64(cutlass.select_(
            streamed, cutlass.Int64(_EVICT_FIRST), cutlass.Int64(_EVICT_NORMAL)))

    @staticmethod
    def _times(x, factor, value):
        """``x * factor``; ``x`` itself where ``value`` (the factor's compile-time value,
        or None) is 1."""
        return x if cutlass.const_expr(value == 1) else x * factor

    @cute.jit
    def accumulated(self, acc, acc_up, i, released):
        """Value ``i`` of the tile's result before the epilogue, read through an opaque
        copy (see the module docstring): ``A @ B^T``, or with ``swiglu``
        ``silu(A @ B^T) * (A @ B_up^T)`` (``g * 1 / (1 + exp(-g))`` with the hardware
        exp and reciprocal, as Inductor's own kernels compute silu).  ``released``: the
        zero read after the tile's last ring slot is released, or None (plain GEMM)."""
        value = _opaque_copy(acc[i], released)
        if cutlass.const_expr(self.swiglu != ""):
            gate = value
            value = (gate * cute.arch.rcp_approx(1.0 + cute.math.exp(-gate, fastmath=True))
                     * _opaque_copy(acc_up[i], released))
        return value

    @staticmethod
    def _epi_slice(t, s, shape):
        """Elements ``[s * n, (s + 1) * n)`` (``n = size(shape)``, compile-time ``s``) of
        ``t`` in its linear (colexicographic) order, as a tensor of ``shape``: the
        coordinates matching an epilogue copy ``frag[v] = t[s * n + v]``."""
        n = cute.size(shape)
        flat = cute.make_tensor(t.iterator, cute.composition(
            t.layout, cute.make_layout(cute.size(t))))
        piece = cute.logical_divide(flat, cute.make_layout(n))[(None, s)]
        return cute.make_tensor(piece.iterator, cute.composition(
            piece.layout, cute.make_layout(shape)))

    @cute.jit
    def load_tile_input(self, tma_t, gT, sC, tile_bars, tile, sub, buf, subs_n):
        """TMA load of sub-tile ``sub`` of the tile input's ``tile`` (m, n, l) into store
        buffer ``buf``, completing on that buffer's mbarrier (called by the store warp)."""
        m_t, n_t, l_t = tile
        sT, gT_subs = cpasync.tma_partition(
            tma_t, 0, cute.make_layout(1), cute.group_modes(sC, 0, 2),
            cute.zipped_divide(gT[(None, None, m_t, n_t, l_t)], self.epi_tile))
        with cute.arch.elect_one():
            cute.arch.mbarrier_arrive_and_expect_tx(
                tile_bars + buf, self.epi_tile[0] * self.epi_tile[1] * self.c_dtype.width // 8)
        cute.copy(tma_t, gT_subs[(None, (sub // subs_n, sub % subs_n))], sT[(None, buf)],
                  tma_bar_ptr=tile_bars + buf)

    @cute.jit
    def epilogue_tile_input(self, prefetched, values):
        """Fusion hook with a tile input (``launch(mTile=...)``): ``values`` holds the
        tile input at the coordinates of the sub-tile's fragment, value for value (its
        dtype, C's); return what :meth:`epilogue_op` gets as ``prefetched``, which
        :meth:`epilogue_prefetch` returned.  Default: ``prefetched``."""
        return prefetched

    # ------------------------------------------------------ ping-pong handoffs
    # Named barriers 3 and 4 (of 256 threads) order the two consumer
    # warpgroups' mainloops in tile order: warpgroup w waits on barrier 3 + w
    # (bar.sync by its 128 threads) until the other warpgroup arrives on it
    # (bar.arrive by its 128 threads) after issuing the last WGMMA of the
    # preceding tile.  Both sides are predicated so that every arrive has
    # exactly one matching wait.  (Barrier 0 is __syncthreads; 1 and 2 are the
    # per-warpgroup epilogue barriers.)
    _PINGPONG_BARRIER = 3

    def pingpong_wait_turn(self, pp_wg):
        """Block this consumer warpgroup until its mainloop turn."""
        pipeline.NamedBarrier(barrier_id=self._PINGPONG_BARRIER + pp_wg,
                              num_threads=2 * _THREADS_PER_WG).arrive_and_wait()

    def pingpong_pass_turn(self, pp_wg):
        """Hand the mainloop turn to the other consumer warpgroup."""
        pipeline.NamedBarrier(barrier_id=self._PINGPONG_BARRIER + 1 - pp_wg,
                              num_threads=2 * _THREADS_PER_WG).arrive()

    def pingpong_skip_stages(self, read_state, free_state, count):
        """Advance both consumer pipeline states past ``count`` ring stages
        (those of the other warpgroup's tile)."""
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
            if cutlass.const_expr(self.swiglu != ""):
                cpasync.prefetch_descriptor(tma_up)
            if cutlass.const_expr(self.store == "tma"):
                cpasync.prefetch_descriptor(tma_c)
            if cutlass.const_expr(self.tile_input):
                cpasync.prefetch_descriptor(tma_t)

        split = self.split_k
        # (m, n, k) of this CTA in the cluster: its multicast coordinates and split rank.
        cta_rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        cta_crd = cluster_layout.get_flat_coord(cta_rank)
        if cutlass.const_expr(split > 1):
            split_rank = cta_crd[2]
            # The CTAs of this output tile: rank split_base + cluster_m * r for split rank r.
            split_base = cta_rank - self.cluster_m * split_rank
            # This CTA's contiguous range of K tiles: balanced, empty if k_tiles < split.
            k_base = k_tiles // split
            k_extra = k_tiles - k_base * split
            k_begin = split_rank * k_base + min(split_rank, k_extra)
            my_k_tiles = (split_rank + 1) * k_base + min(split_rank + 1, k_extra) - k_begin
        else:
            split_rank = cutlass.Int32(0)
            k_begin = cutlass.Int32(0)
            my_k_tiles = k_tiles
        mask_a = 0
        mask_b = 0
        if cutlass.const_expr(self.cluster_n > 1):
            mask_a = cute.make_layout_image_mask(cluster_layout, cta_crd, mode=1)
        if cutlass.const_expr(self.cluster_m > 1):
            mask_b = cute.make_layout_image_mask(cluster_layout, cta_crd, mode=0)

        alloc = SmemAllocator()
        smem = alloc.allocate(self.smem_struct)
        num_consumer_warps = self.num_consumer_threads // 32
        reduce_ready = smem.reduce_bars.data_ptr()
        reduce_free = reduce_ready + 1
        if cutlass.const_expr(split > 1):
            # Fenced and made cluster-visible by the pipeline creation below.
            if warp == 0:
                with cute.arch.elect_one():
                    cute.arch.mbarrier_init(reduce_ready, (split - 1) * num_consumer_warps)
                    cute.arch.mbarrier_init(reduce_free, (split - 1) * num_consumer_warps)
        tile_bars = smem.tile_bars.data_ptr()
        if cutlass.const_expr(self.tile_input):
            # Fenced by the pipeline creation below, as the split-K barriers.
            if warp == 0:
                with cute.arch.elect_one():
                    for b in cutlass.range_constexpr(cute.size(sC_layout, mode=[2])):
                        cute.arch.mbarrier_init(tile_bars + b, 1)

        stage_bytes = self.a_tiles * cute.size_in_bytes(
            self.a_dtype, cute.slice_(sA_layout, (None, None, 0))
        ) + self.b_tiles * cute.size_in_bytes(self.b_dtype,
                                              cute.slice_(sB_layout, (None, None, 0)))
        # Creating the pipeline also initialises its mbarriers and syncs the
        # whole cluster, so every CTA sees initialised barriers before any
        # multicast or remote arrive.  Multicast stays within one split rank
        # (the K mode): consumers release the rings of their M/N partners.
        ring = pipeline.PipelineTmaAsync.create(
            barrier_storage=smem.ring_bars.data_ptr(),
            num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(
                pipeline.Agent.Thread, self.tile_threads),
            tx_count=stage_bytes,
            cta_layout_vmnk=self.cluster_layout(vmnk=True),
            enable_multicast_signaling=True,
        )

        sA = smem.smem_a.get_tensor(sA_layout.outer, swizzle=sA_layout.inner)
        sB = smem.smem_b.get_tensor(sB_layout.outer, swizzle=sB_layout.inner)

        # (tm, tk, tiles_m, tiles_k, L) / (tn, tk, tiles_n, tiles_k, L)
        gA = cute.local_tile(tA, (tm, tk), (None, None, None))
        gB = cute.local_tile(tB, (tn, tk), (None, None, None))

        # TMA partitions: each CTA of a multicast group loads a slice.
        tAsA, tAgA = cpasync.tma_partition(
            tma_a, cta_crd[1], cute.make_layout(self.cluster_n),
            cute.group_modes(sA, 0, 2), cute.group_modes(gA, 0, 2))
        tBsB, tBgB = cpasync.tma_partition(
            tma_b, cta_crd[0], cute.make_layout(self.cluster_m),
            cute.group_modes(sB, 0, 2), cute.group_modes(gB, 0, 2))
        # The up projection's tiles: the smem side partitions as its operand's (same
        # box), only the gmem side is the up weight's.
        if cutlass.const_expr(self.swiglu == "a"):
            _, tUg = cpasync.tma_partition(
                tma_up, cta_crd[1], cute.make_layout(self.cluster_n),
                cute.group_modes(sA, 0, 2),
                cute.group_modes(cute.local_tile(t_up, (tm, tk), (None, None, None)), 0, 2))
        if cutlass.const_expr(self.swiglu == "b"):
            _, tUg = cpasync.tma_partition(
                tma_up, cta_crd[0], cute.make_layout(self.cluster_m),
                cute.group_modes(sB, 0, 2),
                cute.group_modes(cute.local_tile(t_up, (tn, tk), (None, None, None)), 0, 2))

        linear_start = cute.arch.block_idx()[2]
        n_persistent = cute.arch.grid_dim()[2]

        if wg == 0:
            # ------------------------------------------------ producer warpgroup
            cute.arch.setmaxregister_decrease(self.producer_regs)
            if warp == 0:
                # Bytes of one operand row over K, every batch.
                row_bytes = (cutlass.Int64(k_tiles * tk * (self.a_dtype.width // 8))
                             * (total_clusters // (clusters_m * clusters_n)))
                policy_a = self.stream_policy(clusters_n, row_bytes * prob_m)
                policy_b = self.stream_policy(clusters_m, row_bytes * prob_n)
                prod_state = pipeline.make_pipeline_state(
                    pipeline.PipelineUserType.Producer, self.stages)
                linear = linear_start
                while linear < total_clusters:
                    m_t, n_t, l_t = self.tile_of(
                        linear, clusters_m, clusters_n, cta_crd[0], cta_crd[1])
                    src_a = tAgA[(None, m_t, None, l_t)]
                    src_b = tBgB[(None, n_t, None, l_t)]
                    if cutlass.const_expr(self.swiglu == "a"):
                        src_up = tUg[(None, m_t, None, l_t)]
                    if cutlass.const_expr(self.swiglu == "b"):
                        src_up = tUg[(None, n_t, None, l_t)]
                    for kt in range(my_k_tiles):
                        ring.producer_acquire(prod_state)
                        bar = ring.producer_get_barrier(prod_state)
                        k_idx = k_begin + kt
                        # the B slots of this stage (see _setup)
                        slot_b = prod_state.index
                        slot_up = self.stages + prod_state.index
                        if cutlass.const_expr(self.wide_up):
                            slot_b = 2 * prod_state.index
                            slot_up = 2 * prod_state.index + 1
                        cute.copy(tma_a, src_a[(None, k_idx)], tAsA[(None, prod_state.index)],
                                  tma_bar_ptr=bar, mcast_mask=mask_a, cache_policy=policy_a)
                        cute.copy(tma_b, src_b[(None, k_idx)], tBsB[(None, slot_b)],
                                  tma_bar_ptr=bar, mcast_mask=mask_b, cache_policy=policy_b)
                        if cutlass.const_expr(self.swiglu == "a"):
                            cute.copy(tma_up, src_up[(None, k_idx)],
                                      tAsA[(None, self.stages + prod_state.index)],
                                      tma_bar_ptr=bar, mcast_mask=mask_a, cache_policy=policy_a)
                        if cutlass.const_expr(self.swiglu == "b"):
                            cute.copy(tma_up, src_up[(None, k_idx)], tBsB[(None, slot_up)],
                                      tma_bar_ptr=bar, mcast_mask=mask_b, cache_policy=policy_b)
                        ring.producer_commit(prod_state)
                        prod_state.advance()
                    linear += n_persistent
                ring.producer_tail(prod_state)
        else:
            # ----------------------------------------------- consumer warpgroups
            cute.arch.setmaxregister_increase(self.consumer_regs)
            ctid = tidx - _THREADS_PER_WG
            wg_mma = tiled_mma.get_slice((wg - 1) * _THREADS_PER_WG)
            # Ping-pong: which of the two warpgroups this is (0 or 1), each one
            # a whole tile's MMA / epilogue thread group of its own.
            pp_wg = 0
            store_warp = self.store_warp
            if cutlass.const_expr(self.pingpong):
                pp_wg = wg - 1
                ctid = tidx - wg * _THREADS_PER_WG
                wg_mma = tiled_mma.get_slice(0)
                store_warp = self.store_warp + pp_wg * 4
            thr_mma = tiled_mma.get_slice(ctid)
            tCsA = wg_mma.partition_A(sA)
            tCsB = wg_mma.partition_B(sB)
            tCrA = tiled_mma.make_fragment_A(tCsA)
            tCrB = tiled_mma.make_fragment_B(tCsB)
            acc_shape = tiled_mma.partition_shape_C((tm, tn))
            if cutlass.const_expr(self.wide_up):
                # One accumulator (tm, 2 tn): the gate's columns, then the up
                # projection's; acc and acc_up are its two halves, value for value in the
                # layout of a (tm, tn) accumulator (value mode (2, 2, columns / 8)).
                wg_mma_up = tiled_mma_up.get_slice((wg - 1) * _THREADS_PER_WG)
                if cutlass.const_expr(self.pingpong):
                    wg_mma_up = tiled_mma_up.get_slice(0)
                sB_up = smem.smem_b.get_tensor(sB_up_layout.outer, swizzle=sB_up_layout.inner)
                tCrA_up = tiled_mma_up.make_fragment_A(wg_mma_up.partition_A(sA))
                tCrB_up = tiled_mma_up.make_fragment_B(wg_mma_up.partition_B(sB_up))
                acc_both = cute.make_rmem_tensor(
                    tiled_mma_up.partition_shape_C((tm, 2 * tn)), self.acc_dtype)
                half = cute.make_layout(
                    acc_shape, stride=((1, 2, 4), tn, tn * cute.size(acc_shape, mode=[1])))
                acc = cute.make_tensor(acc_both.iterator, half)
                acc_up = cute.make_tensor(acc_both.iterator + tn // 2, half)
            else:
                acc = cute.make_rmem_tensor(acc_shape, self.acc_dtype)
                acc_up = None
                if cutlass.const_expr(self.swiglu != ""):
                    acc_up = cute.make_rmem_tensor(acc_shape, self.acc_dtype)
            k_blocks = cute.size(tCrA, mode=[2])
            unit = self.epi_unit
            num_units = cute.size(acc) // unit
            if cutlass.const_expr(split > 1):
                # Split-K reduction buffer: thread t's fragment element v sits at
                # (v // 4) * 4T + 4t + v % 4 (T consumer threads), so every access
                # is a 16-byte vector and a warp's accesses are contiguous.
                frag = cute.size(acc)
                acc_flat = cute.make_tensor(acc.iterator, cute.make_layout(frag))
                partial = cute.make_rmem_tensor((unit,), self.acc_dtype)
                nthr = self.num_consumer_threads
                reduce_layout = cute.make_layout(((4, frag // 4), nthr),
                                                 stride=((1, 4 * nthr), 4))
                reduce_ptr = smem.reduce_buf.data_ptr()
                my_slot = cute.make_tensor(reduce_ptr, reduce_layout)[(None, ctid)]
                lane = cute.arch.lane_idx()

            if cutlass.const_expr(self.store == "tma"):
                # Epilogue plumbing: registers -> swizzled smem (stmatrix) -> TMA.
                sC = smem.smem_c.get_tensor(sC_layout.outer, swizzle=sC_layout.inner)
                gC = cute.local_tile(tC, (tm, tn), (None, None, None))
                stm_atom = cute.make_copy_atom(
                    cute.nvgpu.warp.StMatrix8x8x16bOp(False, 4), self.c_dtype)
                r2s = cute.make_tiled_copy_S(
                    sm90_utils.get_smem_store_op(
                        LayoutEnum.ROW_MAJOR, self.c_dtype, self.acc_dtype),
                    cute.make_tiled_copy_C_atom(stm_atom, tiled_mma))
                thr_r2s = r2s.get_slice(ctid)
                tRS_sC = thr_r2s.partition_D(sC)                 # (V, M, N, EPI_STAGE)
                tRS_acc = r2s.retile(acc)                        # whole tile, per thread
                tRS_acc_up = r2s.retile(acc_up) if self.swiglu != "" else None
                sub_shape = cute.shape(thr_r2s.partition_S(sC))[:3]
                sub_f32 = cute.make_rmem_tensor(sub_shape, self.acc_dtype)
                sub_out = cute.make_rmem_tensor(sub_shape, self.c_dtype)
                sub_size = cute.size(sub_f32)
                assert sub_size == _EPI_UNIT, sub_size
                epi_m, epi_n = self.epi_tile
                subs_m = tm // epi_m
                subs_n = tn // epi_n
                num_subs = subs_m * subs_n
                # TMA stores per tile by this CTA (sub-tiles s with s % split == rank).
                subs_per_cta = (num_subs - split_rank + split - 1) // split
                epi_bar = pipeline.NamedBarrier(barrier_id=1 + pp_wg,
                                                num_threads=self.tile_threads)
                store_pipe = pipeline.PipelineTmaStore.create(
                    num_stages=self.epi_stages,
                    producer_group=pipeline.CooperativeGroup(
                        pipeline.Agent.Thread, self.tile_threads),
                )
                # Tile input: sub-tiles loaded ahead of the one being stored (at most a
                # tile's worth, so that a load reaches at most the next tile).
                ahead = min(self.epi_stages - 1, num_subs)
                if cutlass.const_expr(self.tile_input):
                    # The tile input's sub-tile, read (ldmatrix) from the store buffer its
                    # TMA load filled, into the layout of sub_out: value for value.
                    s2r = cute.make_tiled_copy_S(
                        cute.make_copy_atom(cute.nvgpu.warp.LdMatrix8x8x16bOp(False, 4),
                                            self.c_dtype),
                        cute.make_tiled_copy_C_atom(stm_atom, tiled_mma))
                    tSR_sC = s2r.get_slice(ctid).partition_S(sC)
                    tile_vals = cute.make_rmem_tensor(sub_shape, self.c_dtype)
                    gT = cute.local_tile(tT, (tm, tn), (None, None, None))
            else:
                # Direct store: the epilogue runs on copies of 16-element chunks.
                chunk = cute.make_rmem_tensor((unit,), self.acc_dtype)
            ident = cute.make_identity_tensor((prob_m, prob_n))

            read_state = pipeline.make_pipeline_state(
                pipeline.PipelineUserType.Consumer, self.stages)
            free_state = pipeline.make_pipeline_state(
                pipeline.PipelineUserType.Consumer, self.stages)
            tiles_done = cutlass.Int32(0)
            linear = linear_start
            walk_stride = n_persistent
            if cutlass.const_expr(self.pingpong):
                # Warpgroup 1 starts on the CTA's second tile, past the stages
                # of the first; both then take every other tile.
                linear = linear_start + pp_wg * n_persistent
                walk_stride = 2 * n_persistent
                self.pingpong_skip_stages(read_state, free_state, k_tiles * pp_wg)
            if cutlass.const_expr(self.tile_input):
                # The first tile's first sub-tiles of the tile input (buffers still unused).
                if warp == store_warp:
                    if linear < total_clusters:
                        first = self.tile_of(linear, clusters_m, clusters_n, cta_crd[0],
                                             cta_crd[1])
                        for s in cutlass.range_constexpr(ahead):
                            self.load_tile_input(tma_t, gT, sC, tile_bars, first, s,
                                                 s + pp_wg * self.epi_stages, subs_n)
            while linear < total_clusters:
                m_t, n_t, l_t = self.tile_of(
                    linear, clusters_m, clusters_n, cta_crd[0], cta_crd[1])
                # Global (m, n) of every accumulator element, in acc's layout.
                coords = thr_mma.partition_C(
                    cute.local_tile(ident, (tm, tn), (m_t, n_t)))
                if cutlass.const_expr(self.pingpong):
                    if linear > linear_start:
                        self.pingpong_wait_turn(pp_wg)

                # ---------------- main loop: one WGMMA batch kept in flight
                # The tile's first WGMMAs overwrite the accumulators (k >= 1, so there
                # are some) instead of zeroing instructions between two tiles' mainloops.
                # A split-K rank's K range may be empty: it zeroes them instead.
                tiled_mma.set(warpgroup.Field.ACCUMULATE, split > 1)
                if cutlass.const_expr(self.wide_up):
                    tiled_mma_up.set(warpgroup.Field.ACCUMULATE, False)
                if cutlass.const_expr(split > 1):
                    acc.fill(0.0)
                for kt in range(my_k_tiles):
                    ring.consumer_wait(read_state)
                    # per k-tile, as the compiler would otherwise inject it (ptxas C7519)
                    warpgroup.fence()
                    for kb in cutlass.range_constexpr(k_blocks):
                        if cutlass.const_expr(self.wide_up):
                            # both weights' tiles of this stage, as one tile 2 tn wide
                            cute.gemm(tiled_mma_up, acc_both,
                                      tCrA_up[(None, None, kb, read_state.index)],
                                      tCrB_up[(None, None, kb, read_state.index)], acc_both)
                            tiled_mma_up.set(warpgroup.Field.ACCUMULATE, True)
                        else:
                            cute.gemm(tiled_mma, acc,
                                      tCrA[(None, None, kb, read_state.index)],
                                      tCrB[(None, None, kb, read_state.index)], acc)
                            if cutlass.const_expr(self.swiglu != ""):
                                # the up projection's tile: the doubled operand's slot
                                # stages + s, the other operand's tile shared
                                up_a = self.stages * (self.swiglu == "a") + read_state.index
                                up_b = self.stages * (self.swiglu == "b") + read_state.index
                                cute.gemm(tiled_mma, acc_up, tCrA[(None, None, kb, up_a)],
                                          tCrB[(None, None, kb, up_b)], acc_up)
                            tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
                    warpgroup.commit_group()
                    warpgroup.wait_group(1)
                    if kt > 0:
                        ring.consumer_release(free_state)
                        free_state.advance()
                    read_state.advance()
                if cutlass.const_expr(self.store == "tma"):
                    tRS_coords = r2s.retile(coords)
                    if cutlass.const_expr(split == 1):
                        # The first sub-tile's epilogue inputs load while the last
                        # WGMMAs run (each later one's while its predecessor stores).
                        upcoming = self.epilogue_prefetch(
                            self._epi_slice(tRS_coords, 0, sub_shape), l_t, prob_m, prob_n,
                            mBias, epi_args)
                if cutlass.const_expr(self.pingpong):
                    # Every WGMMA of this tile is issued: the other warpgroup
                    # may start issuing its next tile (if there is one).
                    if linear + n_persistent < total_clusters:
                        self.pingpong_pass_turn(pp_wg)
                warpgroup.wait_group(0)
                released = None
                if cutlass.const_expr(self.epilogue_math):
                    released = cutlass.Float32(0.0)
                if my_k_tiles > 0:
                    ring.consumer_release(free_state)
                    if cutlass.const_expr(self.epilogue_math):
                        released = _zero_after_release(ring.consumer_get_barrier(free_state))
                    free_state.advance()
                if cutlass.const_expr(self.pingpong):
                    # The other warpgroup's next tile comes next in the ring.
                    self.pingpong_skip_stages(read_state, free_state, k_tiles)

                if cutlass.const_expr(split > 1):
                    # ---------------- split-K: reduce-scatter over the cluster.  Publish
                    # this tile's partial sums once the peers have read the last ones.
                    cute.arch.mbarrier_wait(reduce_free, (tiles_done + 1) % 2)
                    cute.arch.fence_acq_rel_cluster()  # the peers' reads before our writes
                    cute.autovec_copy(acc_flat, my_slot)
                    cute.arch.sync_warp()
                    if lane == 0:
                        cute.arch.fence_acq_rel_cluster()
                        for peer in cutlass.range_constexpr(split):
                            if peer != split_rank:
                                cute.arch.mbarrier_arrive(
                                    reduce_ready, split_base + self.cluster_m * peer,
                                    scope=nvvm.MemScopeKind.CLUSTER)
                    # Add the peers' partials of the epilogue units this CTA owns.
                    cute.arch.mbarrier_wait(reduce_ready, tiles_done % 2)
                    cute.arch.fence_acq_rel_cluster()
                    for u in cutlass.range_constexpr(num_units):
                        if u % split == split_rank:
                            for peer in cutlass.range_constexpr(split):
                                if peer != split_rank:
                                    peer_slot = cute.make_tensor(
                                        cute.arch.map_dsmem_ptr(
                                            reduce_ptr, split_base + self.cluster_m * peer),
                                        reduce_layout)[(None, ctid)]
                                    cute.autovec_copy(
                                        self._epi_slice(peer_slot, u, (unit,)), partial)
                                    for v in cutlass.range_constexpr(unit):
                                        acc_flat[u * unit + v] += partial[v]
                    # Each warp hands the peers' buffers back once it has read them.
                    cute.arch.sync_warp()
                    if lane == 0:
                        for peer in cutlass.range_constexpr(split):
                            if peer != split_rank:
                                cute.arch.mbarrier_arrive(
                                    reduce_free, split_base + self.cluster_m * peer,
                                    scope=nvvm.MemScopeKind.CLUSTER)

                # Epilogue unit u (``unit`` values per thread: a TMA-store sub-tile or
                # a direct-store chunk, both the fragment's values [u * unit, ...))
                # belongs to CTA rank u % split_k: to this CTA without split-K.
                if cutlass.const_expr(self.store == "tma"):
                    # ---------------- per sub-tile: copy -> epilogue_op -> cast
                    # -> smem -> TMA store.  The fusion hook works on the copy
                    # (sub_f32), never on acc: writes to the WGMMA accumulator
                    # registers make ptxas serialize the next tile's mainloop.
                    gC_tile = cute.zipped_divide(gC[(None, None, m_t, n_t, l_t)],
                                                 self.epi_tile)
                    bSG_sC, bSG_gC = cpasync.tma_partition(
                        tma_c, 0, cute.make_layout(1),
                        cute.group_modes(sC, 0, 2), gC_tile)
                    for s in cutlass.range_constexpr(num_subs):
                        prefetched = None
                        if cutlass.const_expr(split == 1):
                            prefetched = upcoming
                            if cutlass.const_expr(s + 1 < num_subs):
                                upcoming = self.epilogue_prefetch(
                                    self._epi_slice(tRS_coords, s + 1, sub_shape), l_t,
                                    prob_m, prob_n, mBias, epi_args)
                        if s % split == split_rank:
                            sub_coords = self._epi_slice(tRS_coords, s, sub_shape)
                            sub_inputs = prefetched
                            if cutlass.const_expr(split > 1):
                                sub_inputs = self.epilogue_prefetch(
                                    sub_coords, l_t, prob_m, prob_n, mBias, epi_args)
                            # This CTA's (s // split)-th store of the tile: consecutive
                            # stores rotate through the smem buffers.
                            stored = tiles_done * subs_per_cta + s // split
                            buf = stored % self.epi_stages
                            if cutlass.const_expr(self.pingpong):
                                buf += pp_wg * self.epi_stages
                            if cutlass.const_expr(self.tile_input):
                                # The tile input's sub-tile sits in the buffer this sub-tile
                                # is stored from: each thread reads, then overwrites, the
                                # same smem elements (ldmatrix / stmatrix of one layout).
                                cute.arch.mbarrier_wait(tile_bars + buf,
                                                        (stored // self.epi_stages) % 2)
                                cute.copy(s2r, tSR_sC[(None, None, None, buf)],
                                          s2r.retile(tile_vals))
                                sub_inputs = self.epilogue_tile_input(sub_inputs, tile_vals)
                            for v in cutlass.range_constexpr(sub_size):
                                sub_f32[v] = self.accumulated(tRS_acc, tRS_acc_up,
                                                              s * sub_size + v, released)
                            self.epilogue_op(sub_f32, sub_coords, l_t, prob_m, prob_n, mBias,
                                             alpha, beta, epi_args, sub_inputs)
                            sub_out.store(sub_f32.load().to(self.c_dtype))
                            cute.copy(r2s, sub_out, tRS_sC[(None, None, None, buf)])
                            cute.arch.fence_proxy("async.shared", space="cta")
                            epi_bar.arrive_and_wait()
                            if warp == store_warp:
                                cute.copy(tma_c, bSG_sC[(None, buf)],
                                          bSG_gC[(None, (s // subs_n, s % subs_n))],
                                          cache_policy=cutlass.Int64(_EVICT_NORMAL))
                                store_pipe.producer_commit()
                                store_pipe.producer_acquire()
                                if cutlass.const_expr(self.tile_input):
                                    # Into the buffer of store stored + ahead -
                                    # epi_stages (the one before this store where ahead
                                    # is epi_stages - 1), once the TMA has read it.
                                    cute.arch.cp_async_bulk_wait_group(
                                        self.epi_stages - ahead, read=True)
                                    buf_ahead = ((stored + ahead) % self.epi_stages
                                                 + pp_wg * self.epi_stages)
                                    if cutlass.const_expr(s + ahead < num_subs):
                                        self.load_tile_input(
                                            tma_t, gT, sC, tile_bars, (m_t, n_t, l_t),
                                            s + ahead, buf_ahead, subs_n)
                                    else:
                                        # the first sub-tiles of this warpgroup's next tile
                                        if linear + walk_stride < total_clusters:
                                            self.load_tile_input(
                                                tma_t, gT, sC, tile_bars,
                                                self.tile_of(linear + walk_stride, clusters_m,
                                                             clusters_n, cta_crd[0],
                                                             cta_crd[1]),
                                                s + ahead - num_subs, buf_ahead, subs_n)
                            epi_bar.arrive_and_wait()

                else:
                    # ---------------- predicated direct stores (any N), chunk by
                    # chunk of the fragment, each through a copy (see above).
                    for s in cutlass.range_constexpr(num_units):
                        if s % split == split_rank:
                            for v in cutlass.range_constexpr(unit):
                                chunk[v] = self.accumulated(acc, acc_up, s * unit + v, released)
                            chunk_coords = self._epi_slice(coords, s, (unit,))
                            self.epilogue_op(
                                chunk, chunk_coords, l_t, prob_m, prob_n, mBias, alpha, beta,
                                epi_args, self.epilogue_prefetch(chunk_coords, l_t, prob_m,
                                                                 prob_n, mBias, epi_args))
                            for v in cutlass.range_constexpr(unit):
                                mn = chunk_coords[v]
                                if cute.elem_less(mn, (prob_m, prob_n)):
                                    tC[mn[0], mn[1], l_t] = chunk[v].to(self.c_dtype)

                tiles_done += 1
                linear += walk_stride
            if cutlass.const_expr(split > 1):
                # A CTA may exit only after its peers have read its last partials.
                cute.arch.mbarrier_wait(reduce_free, (tiles_done + 1) % 2)
            if cutlass.const_expr(self.store == "tma"):
                if warp == store_warp:
                    store_pipe.producer_tail()


# --------------------------------------------------------------------------
# Configurations and selection heuristic
# --------------------------------------------------------------------------
DEFAULT_CONFIGS = [
    dict(tile_m=128, tile_n=256, tile_k=64, cluster_m=2, cluster_n=1, cooperative=True, raster="m"),
    dict(tile_m=128, tile_n=256, tile_k=64, cluster_m=1, cluster_n=2, cooperative=True, raster="n"),
    dict(tile_m=256, tile_n=128, tile_k=64, cluster_m=1, cluster_n=2, cooperative=True, raster="n"),
    dict(tile_m=128, tile_n=256, tile_k=64, cluster_m=1, cluster_n=1, cooperative=True, raster="m"),
    dict(tile_m=128, tile_n=128, tile_k=64, cluster_m=2, cluster_n=1, cooperative=True, raster="m"),
    dict(tile_m=128, tile_n=128, tile_k=64, cluster_m=1, cluster_n=1, cooperative=True, raster="m"),
    dict(tile_m=64, tile_n=256, tile_k=64, cluster_m=1, cluster_n=1, cooperative=False, raster="n"),
    dict(tile_m=64, tile_n=128, tile_k=64, cluster_m=1, cluster_n=2, cooperative=False, raster="n"),
    # 14336 / 224 = 64 N tiles: at N = 14336 whole waves where 128- and 256-wide tiles
    # leave SMs idle (112 or 56 tiles per M tile on 132 SMs).  On the H200 (bf16,
    # gemm_sweep.py, nt / nn, of cuBLAS) at 1024x14336x4096 0.96 / 1.00 against the best
    # offered then 0.92 / 1.00, at 256x14336x4096 0.95 / 1.02 against 0.92 / 1.01.
    dict(tile_m=128, tile_n=224, tile_k=64, cluster_m=2, cluster_n=1, cooperative=True, raster="m"),
    # 192 accumulator registers per thread, the L2 -> smem traffic per FLOP of 256x128 less
    # 22%: on the H200 (bf16, gemm_sweep.py --rounds 5, nt / nn, against the best offered
    # then) 8192x128256x4096 1.03 / 1.03, 8192x14336x4096 1.03 / 1.01, 1024x128256x4096
    # 1.03 / 0.99; at N = 4096 (22 N tiles of 192) 0.96-0.98.  Its c2x1 twin was slower
    # but at 1024x128256x4096 nn (1.01).
    dict(tile_m=256, tile_n=192, tile_k=64, cluster_m=1, cluster_n=2, cooperative=True, raster="n"),
    # Ping-pong: tile sizes are per consumer warpgroup (128x128 the largest offered).
    dict(tile_m=128, tile_n=128, tile_k=64, cluster_m=2, cluster_n=1, cooperative=False,
         pingpong=True, raster="m"),
    dict(tile_m=128, tile_n=128, tile_k=64, cluster_m=1, cluster_n=2, cooperative=False,
         pingpong=True, raster="n"),
    dict(tile_m=64, tile_n=256, tile_k=64, cluster_m=1, cluster_n=2, cooperative=False,
         pingpong=True, raster="n"),
]

# Extra small-tile candidates only used by the heuristic for tiny problems.
_EXTRA_CONFIGS = [
    dict(tile_m=64, tile_n=64, tile_k=64, cluster_m=1, cluster_n=1, cooperative=False, raster="n"),
    # Half the k-tiles (pipeline round trips) of the above; on the H200 at 128x4096x4096
    # 0.92 of cuBLAS against 0.86 (benchmarks/gemm_sweep.py).
    dict(tile_m=64, tile_n=64, tile_k=128, cluster_m=1, cluster_n=1, cooperative=False,
         raster="n"),
    dict(tile_m=128, tile_n=64, tile_k=64, cluster_m=1, cluster_n=1, cooperative=False, raster="m"),
    dict(tile_m=128, tile_n=128, tile_k=64, cluster_m=1, cluster_n=1, cooperative=False,
         pingpong=True, raster="m"),
    # Two M tiles share each B tile by multicast: where M spans only a few tiles and N x K
    # (the weight) is the whole stream, that halves B's L2 reads.  On the H200 (bf16,
    # benchmarks/gemm_sweep.py, nt / nn): 64x64x128 at 128x4096x4096 1.02 / 0.95 of
    # cuBLAS and at 128x4096x14336 1.01 / 0.98 (the best offered then: 0.91-0.94);
    # 128x64 at 256x4096x14336 0.94 / 0.98 (then 0.84 / 0.92).
    dict(tile_m=64, tile_n=64, tile_k=128, cluster_m=2, cluster_n=1, cooperative=False,
         raster="n"),
    dict(tile_m=128, tile_n=64, tile_k=64, cluster_m=2, cluster_n=1, cooperative=False, raster="m"),
    # The same pair with the tile's long side along N: at 1024x1024x1024 (bf16, nt / nn)
    # 0.98 / 0.98 of cuBLAS against 0.97 / 0.96 for the best offered then.
    dict(tile_m=64, tile_n=128, tile_k=64, cluster_m=2, cluster_n=1, cooperative=False, raster="m"),
    # Two M tiles of 64 x 64 N tiles of 224 at N = 14336: 128 CTAs, multicasting B.  At
    # 128x14336x4096 0.99 / 0.95 of cuBLAS against the best offered then 0.97 / 0.99.
    dict(tile_m=64, tile_n=224, tile_k=64, cluster_m=2, cluster_n=1, cooperative=False,
         raster="n"),
]

# Split-K candidates (``split_k`` in ``_SPLIT_K_FACTORS``), only for problems with too
# few output tiles to fill the SMs.  Their reduction buffer leaves room for >= 3 stages.
_SPLIT_K_BASE_CONFIGS = [
    dict(tile_m=64, tile_n=64, tile_k=64, cluster_m=1, cluster_n=1, cooperative=False, raster="n"),
    # 12 stages keep more of B in flight, where M is small and B's stream is the whole
    # cost: on the H200 at 16x4096x14336 (k2) 0.96 of cuBLAS against 0.91 with 8.
    dict(tile_m=64, tile_n=64, tile_k=64, cluster_m=1, cluster_n=1, cooperative=False,
         raster="n", stages=12),
    dict(tile_m=64, tile_n=128, tile_k=64, cluster_m=1, cluster_n=1, cooperative=False, raster="n"),
    dict(tile_m=64, tile_n=256, tile_k=64, cluster_m=1, cluster_n=1, cooperative=False, raster="n"),
    dict(tile_m=128, tile_n=128, tile_k=64, cluster_m=1, cluster_n=1, cooperative=True, raster="m"),
    # Pairs of M tiles that multicast B (the large operand at small M) to each other.
    dict(tile_m=64, tile_n=128, tile_k=64, cluster_m=2, cluster_n=1, cooperative=False, raster="n"),
    dict(tile_m=128, tile_n=128, tile_k=64, cluster_m=2, cluster_n=1, cooperative=True, raster="m"),
]
# Swap-AB candidates for small M (<= _SWAP_AB_MAX_M): the caller computes C^T = B A^T,
# so the weight's N rows fill the WGMMA's M mode (64-row atoms) and torch's M its N mode,
# in a tile of 16 or 32 (``_swap_ab_configs``) instead of a 64-row tile that is mostly
# padding; the output is the column-major C^T, written by the direct store.  tile_n is
# filled in per problem.  On the H200 (bf16, gemm_sweep.py, nt / nn, ratios to cuBLAS) at
# M = 16 the best swapped tile against the best unswapped one: 16x4096x4096 1.05 / 1.10
# (64x16, 16 stages) against 0.95 / 0.92; 16x14336x4096 1.01 / 1.00 (128x16) against
# 0.94 / 0.96; 16x4096x14336 1.02 / 1.02 against 0.96 / 0.96; 16x128256x4096 1.01 / 1.01
# against 1.00 / 1.00.  At M = 64 (a 64-wide tile, no padding saved) the swapped tiles
# matched the unswapped ones within 2% and pushed a winner out of the offered eight.
_SWAP_AB_BASE_CONFIGS = [
    # 16 stages: 1.05 / 1.10 at 16x4096x4096 against 0.94 / 0.93 with 8.
    dict(tile_m=64, tile_k=64, cluster_m=1, cluster_n=1, cooperative=False, raster="m",
         stages=16),
    dict(tile_m=64, tile_k=64, cluster_m=2, cluster_n=1, cooperative=False, raster="m",
         stages=16),
    dict(tile_m=128, tile_k=64, cluster_m=1, cluster_n=1, cooperative=False, raster="m"),
    # A k-tile of 128: the weight's TMA box rows are 256 bytes long instead of 128 where
    # it is K-major (an nn.Linear weight).  H200, nt (bf16, gemm_sweep.py, of cuBLAS):
    # 16x128256x4096 1.04 against 1.02-1.03 for the 64-wide k-tiles, 16x14336x4096 1.03
    # against 1.00-1.01; nn unchanged (1.00 against 1.00-1.01).
    dict(tile_m=128, tile_k=128, cluster_m=1, cluster_n=1, cooperative=False, raster="m"),
    dict(tile_m=128, tile_k=64, cluster_m=1, cluster_n=1, cooperative=True, raster="m"),
    dict(tile_m=128, tile_k=64, cluster_m=2, cluster_n=1, cooperative=True, raster="m"),
    dict(tile_m=256, tile_k=64, cluster_m=1, cluster_n=1, cooperative=True, raster="m"),
]
_SWAP_AB_MAX_M = 32


def _swap_ab_configs(m: int) -> list:
    """The swap-AB candidates for an M <= _SWAP_AB_MAX_M: C^T's N tile 16 or 32 wide."""
    tile_n = 16 if m <= 16 else 32
    return [dict(cfg, tile_n=tile_n, swap_ab=True, store="direct")
            for cfg in _SWAP_AB_BASE_CONFIGS]


# 8 (clusters of 8 CTAs, 15 co-resident) is not offered: on the H200 it lost every time to
# 2 (16x4096x14336: 0.71 of cuBLAS against 0.88 for 64x128 tiles) and its candidates
# pushed measured winners out of the offered configs (gemm_sweep.py).
_SPLIT_K_FACTORS = (2, 4)
# Split-K is considered while the output tiles fill less than this fraction of the SMs.
_SPLIT_K_MAX_FILL = 0.6
# A CTA's share of the reduce-scatter reads (split_k - 1) / split_k fp32 tiles through
# DSMEM: at ~32 B/clk against ~2048 WGMMA FMA/clk per SM a whole tile costs about as
# much as this many extra K elements of mainloop.
_SPLIT_K_REDUCE_K = 256

# Rough relative mainloop efficiency of a tile shape (bigger tiles reuse more).
_TILE_EFFICIENCY = {
    (256, 192): 1.03, (128, 256): 1.00, (256, 128): 1.00, (128, 224): 0.98, (128, 192): 0.95,
    (128, 128): 0.88, (64, 256): 0.80, (64, 224): 0.78, (128, 64): 0.70, (64, 128): 0.70,
    (64, 64): 0.55,
}
# Ping-pong tiles (per warpgroup) once every CTA has at least two tiles, so that
# the epilogues hide behind the other warpgroup's mainloop.  With fewer tiles a
# ping-pong CTA is one warpgroup doing the whole tile while the other idles:
# _PINGPONG_ONE_WAVE x the table above.
_PINGPONG_EFFICIENCY = {(128, 128): 0.97, (64, 256): 0.88}
_PINGPONG_ONE_WAVE = 0.9


def config_name(cfg: dict) -> str:
    """Short stable name, e.g. ``t128x256x64_c2x1_coop_rm`` (``_pp_`` for ping-pong,
    ``_k4`` for split_k=4, ``_swap`` for swap-AB, whose tile is C^T's, ``_swiglu`` for
    the two-weight kernel, ``_g4`` for a raster band of 4 clusters instead of
    ``DEFAULT_GROUP_SIZE``)."""
    split_k = cfg.get("split_k", 1)
    if cfg.get("pingpong", False):
        consumers = "pp"
    else:
        consumers = "coop" if cfg.get("cooperative", True) else "1wg"
    group_size = cfg.get("group_size", DEFAULT_GROUP_SIZE)
    return "t{}x{}x{}_c{}x{}_{}_r{}{}{}{}{}{}{}".format(
        cfg["tile_m"], cfg["tile_n"], cfg.get("tile_k", 64), cfg.get("cluster_m", 1),
        cfg.get("cluster_n", 1), consumers,
        cfg.get("raster", "m"), f"_g{group_size}" if group_size != DEFAULT_GROUP_SIZE else "",
        f"_s{cfg['stages']}" if cfg.get("stages") else "",
        f"_k{split_k}" if split_k > 1 else "",
        "_swap" if cfg.get("swap_ab") else "",
        "_swiglu" if cfg.get("swiglu") else "",
        "_direct" if cfg.get("store", "tma") == "direct" and not cfg.get("swap_ab") else "")


def pick_configs(m: int, n: int, k: int, dtype: Any = "bf16",
                 max_configs: Optional[int] = 8,
                 l: int = 1, num_sms: int = _DEFAULT_NUM_SMS, out_dtype: Any = None) -> list:
    """Rank candidate configs for an (m, n, k, l) problem, best guess first: the first
    ``max_configs`` of them, or every one (``None``).

    When ``n * sizeof(out)`` is not a multiple of 16 bytes every returned
    config has ``store="direct"`` (see :class:`Sm90Gemm`).

    Cost model: waves x per-tile work / tile efficiency, with padding waste of
    partial tiles counted as work.  A ping-pong config gets its better
    efficiency only with at least two waves (two tiles per CTA), a worse one
    otherwise.  Ties prefer multicast clusters (less L2 traffic) and the
    raster whose fast direction has more tiles.

    Split-K candidates enter only when the output tiles fill less than
    ``_SPLIT_K_MAX_FILL`` of the SMs and every split gets >= 2 K tiles; their
    per-tile work is ``ceil(k / split_k)`` plus the DSMEM reduction, counted
    as ``_SPLIT_K_REDUCE_K * (split_k - 1) / split_k`` K elements.  Swap-AB
    candidates (``swap_ab=True``, M <= ``_SWAP_AB_MAX_M``) are scored on the
    swapped problem (N x M), their own split-K variants included; ``swap_ab`` is
    the caller's field (the template passes the kernel B, A and C^T), not a
    :class:`Sm90Gemm` parameter.
    """
    c_bytes = _DTYPE_BYTES.get(_dtype_key(out_dtype or dtype) or "bf16", 2)
    direct = (n * c_bytes) % 16 != 0
    del dtype  # both 16-bit input types behave the same
    candidates = list(DEFAULT_CONFIGS + _EXTRA_CONFIGS)
    split_bases = [(cfg, m, n) for cfg in _SPLIT_K_BASE_CONFIGS]
    if m <= _SWAP_AB_MAX_M:
        swapped = _swap_ab_configs(m)
        candidates += swapped
        split_bases += [(cfg, n, m) for cfg in swapped]
    for cfg, pm, pn in split_bases:
        tiles = _ceil_div(pm, cfg["tile_m"]) * _ceil_div(pn, cfg["tile_n"]) * l
        k_tiles = _ceil_div(k, cfg["tile_k"])
        if tiles < _SPLIT_K_MAX_FILL * num_sms:
            candidates += [dict(cfg, split_k=s) for s in _SPLIT_K_FACTORS if k_tiles >= 2 * s
                           and not Sm90Gemm.config_error(**cfg, split_k=s)]
    scored = []
    for cfg in candidates:
        tm, tn = cfg["tile_m"], cfg["tile_n"]
        cm, cn = cfg.get("cluster_m", 1), cfg.get("cluster_n", 1)
        split_k = cfg.get("split_k", 1)
        pm, pn = (n, m) if cfg.get("swap_ab") else (m, n)
        tiles_m, tiles_n = _ceil_div(pm, tm), _ceil_div(pn, tn)
        clusters = _ceil_div(tiles_m, cm) * _ceil_div(tiles_n, cn) * l
        slots = (_split_k_clusters(num_sms, cm * cn * split_k) if split_k > 1
                 else max(1, num_sms // (cm * cn)))
        waves = _ceil_div(clusters, slots)
        k_work = max(_ceil_div(k, split_k), 64) + _SPLIT_K_REDUCE_K * (split_k - 1) / split_k
        efficiency = _TILE_EFFICIENCY.get((tm, tn), 0.6)
        if cfg.get("pingpong", False):
            efficiency = (_PINGPONG_EFFICIENCY.get((tm, tn), efficiency) if waves >= 2
                          else efficiency * _PINGPONG_ONE_WAVE)
        cost = waves * tm * tn * k_work / efficiency
        # Clusters whose partner CTA would sit entirely outside the problem
        # waste an SM: penalise clusters along a dimension with a single tile.
        if (cm > 1 and tiles_m < 2) or (cn > 1 and tiles_n < 2):
            cost *= 1.5
        bonus = 0.0
        if cm * cn > 1:
            bonus -= 0.02
        if cfg.get("tile_k", 64) == 128:  # the model counts K elements, not k-tile round trips
            bonus -= 0.01
        if (cfg.get("raster", "m") == "m") == (tiles_m >= tiles_n):
            bonus -= 0.01
        scored.append((cost * (1.0 + bonus), config_name(cfg), cfg))
    scored.sort(key=lambda t: (t[0], t[1]))
    out = []
    for _, _, cfg in scored:
        cfg = dict(cfg, store="direct") if direct else dict(cfg)
        if cfg not in out:
            out.append(cfg)
        if max_configs is not None and len(out) >= max_configs:
            break
    return out


_SWIGLU_MIN_STAGES = 3


def swiglu_configs(m: int, n: int, k: int, dtype: Any = "bf16",
                   max_configs: Optional[int] = 8,
                   l: int = 1, out_dtype: Any = None) -> list:
    """Ranked configs of the two-weight kernel for an (m, n, k, l) problem.

    Where M <= ``_SWAP_AB_MAX_M`` the swap-AB ones come first (``swiglu="a"``: the
    weights in A's place, as swap-AB beats the unswapped tiles there): the swapped
    candidates of :func:`pick_configs` for (m, n, k), their stage count left to the
    kernel (two weight tiles per stage).  Then ``swiglu="b"``: per output tile the WGMMA
    work of a GEMM tile twice as wide, so :func:`pick_configs`'s for N = 2n (without
    split-K or swap-AB) with half their tile width, where that width is offered (the
    direct store where ``n`` rows of the output are not whole 16-byte units).  Configs
    whose two weight tiles leave room for fewer than ``_SWIGLU_MIN_STAGES`` stages are
    left out: on the H200 the swapped 256x16 tile (2 stages) ran at 0.23-0.91 of two
    cuBLAS GEMMs at M = 16, the 64x16 one at 1.04-1.29."""
    c_bytes = _DTYPE_BYTES.get(_dtype_key(out_dtype or dtype) or "bf16", 2)
    store = "direct" if (n * c_bytes) % 16 else "tma"
    candidates = []
    if m <= _SWAP_AB_MAX_M:
        candidates += [
            dict({key: v for key, v in cfg.items() if key != "stages"}, swiglu="a")
            for cfg in pick_configs(m, n, k, dtype, max_configs=None, l=l,
                                    out_dtype=out_dtype)
            if cfg.get("swap_ab") and cfg.get("split_k", 1) == 1]
    candidates += [
        dict(cfg, tile_n=cfg["tile_n"] // 2, swiglu="b", store=store)
        for cfg in pick_configs(m, 2 * n, k, dtype, max_configs=None, l=l,
                                out_dtype=out_dtype)
        if cfg.get("split_k", 1) == 1 and not cfg.get("swap_ab") and cfg["tile_n"] % 2 == 0]
    out = []
    for cfg in candidates:
        if Sm90Gemm.config_error(**cfg) is not None or cfg in out:
            continue
        kernel = Sm90Gemm(**{key: v for key, v in cfg.items() if key != "swap_ab"})
        if kernel.ring_stages(2, c_bytes) >= _SWIGLU_MIN_STAGES:  # swap_ab: the caller's
            out.append(cfg)
        if max_configs is not None and len(out) >= max_configs:
            break
    return out


# --------------------------------------------------------------------------
# Compilation helpers (GPU-less: set CUTE_DSL_ARCH=sm_90a before importing cutlass)
# --------------------------------------------------------------------------
def make_fake_gemm_args(ab_dtype: Any = "bf16", out_dtype: Any = "bf16", a_major: str = "k",
                        b_major: str = "k", bias_dtype: Any = None, store: str = "tma",
                        c_major: str = "n"):
    """Fake (A, B, C, Bias) tensors with symbolic M, N, K, L and symbolic strides.

    Non-unit strides are declared divisible by 16 bytes (the TMA contract);
    with ``store="tma"`` N is declared divisible by ``16 // sizeof(C)`` too
    (the compiled function then rejects other N at call time); ``c_major="m"``
    makes C column-major (``store="direct"`` only);
    the bias (if ``bias_dtype``) gets fully symbolic strides (0 allowed) and
    shares the M/N/L symbols with C.  Returns ``(A, B, C, Bias_or_None)``.
    """
    from cutlass.cute.runtime import make_fake_tensor

    ab = _dtype_key(ab_dtype)
    ck = _dtype_key(out_dtype)
    if ab not in ("bf16", "fp16") or ck is None:
        raise ValueError(f"unsupported dtypes {ab_dtype}/{out_dtype}")
    ab_div = 16 // _DTYPE_BYTES[ab]
    c_div = 16 // _DTYPE_BYTES[ck]
    m, k = cute.sym_int32(), cute.sym_int32()
    n = cute.sym_int32(divisibility=c_div if store == "tma" else 1)
    l = cute.sym_int32()
    lda, ldb = cute.sym_int64(divisibility=ab_div), cute.sym_int64(divisibility=ab_div)
    bsa, bsb = cute.sym_int64(divisibility=ab_div), cute.sym_int64(divisibility=ab_div)
    ldc, bsc = cute.sym_int64(divisibility=c_div), cute.sym_int64(divisibility=c_div)
    t_ab = _CUTLASS_DTYPES[ab]
    a = make_fake_tensor(t_ab, (m, k, l), (lda, 1, bsa) if a_major == "k" else (1, lda, bsa),
                         assumed_align=16)
    b = make_fake_tensor(t_ab, (n, k, l), (ldb, 1, bsb) if b_major == "k" else (1, ldb, bsb),
                         assumed_align=16)
    c = make_fake_tensor(_CUTLASS_DTYPES[ck], (m, n, l),
                         (ldc, 1, bsc) if c_major == "n" else (1, ldc, bsc), assumed_align=16)
    bias = None
    if bias_dtype is not None:
        bk = _dtype_key(bias_dtype)
        if bk is None:
            raise ValueError(f"unsupported bias dtype {bias_dtype}")
        bias = make_fake_tensor(_CUTLASS_DTYPES[bk], (m, n, l),
                                (cute.sym_int64(), cute.sym_int64(), cute.sym_int64()))
    return a, b, c, bias


def compile_sm90_gemm(config: dict, ab_dtype: Any = "bf16", out_dtype: Any = "bf16",
                      a_major: str = "k", b_major: str = "k", bias_dtype: Any = None,
                      kernel_cls: type = None, c_major: str = "n"):
    """Compile one GEMM variant with symbolic shapes and the TVM-FFI ABI.

    The result is called as ``f(A, B, C, Bias_or_None, alpha, beta)`` with
    torch CUDA tensors (views of the rank-3 layouts of the module docstring)
    and Python floats; it runs on the current TVM-FFI environment stream
    (torch's current stream).
    """
    from cutlass.runtime import make_fake_stream

    cls = kernel_cls or Sm90Gemm
    gemm = cls(**config)
    a, b, c, bias = make_fake_gemm_args(ab_dtype, out_dtype, a_major, b_major, bias_dtype,
                                        store=config.get("store", "tma"), c_major=c_major)
    return cute.compile(gemm, a, b, c, bias, cutlass.Float32(1.0), cutlass.Float32(0.0),
                        make_fake_stream(use_tvm_ffi_env_stream=True),
                        options="--enable-tvm-ffi")
