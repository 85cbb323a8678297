"""The GEMM's epilogue: the fusion hooks ``Sm90Gemm`` inherits (``EpilogueHooks``) and
the two store paths a consumer warpgroup runs per tile (``TmaStore``, ``DirectStore``).

Epilogue unit u (``epi_unit`` accumulator values per thread: a TMA-store sub-tile of
``epi_tile`` or a direct-store chunk, the fragment's values ``[u * unit, (u + 1) *
unit)``) belongs to split-K rank ``u % split_k``, so to every CTA without split-K. Per
unit: an opaque copy of the accumulator values (``epilogue_values``: ``operands.value``)
-> ``epilogue_op`` on the copy -> cast -> store. The accumulator itself is never written
outside the WGMMAs (see ``sm90_gemm``'s docstring). A store path object belongs to one ``Sm90Gemm``; its
``setup``, while the kernel is traced, builds the consumer warpgroup's plumbing (values
that do not change across tiles); every value that does is passed in and returned.
"""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import cpasync
from cutlass.tensor_utils import LayoutEnum

from ..sm90 import THREADS_PER_WG, GemmBarrier
from .ptx import EVICT_NORMAL

_EPI_UNIT = 16  # accumulator values per thread in one epilogue unit, where there are as many


def epilogue_unit(tile_m: int, tile_n: int, tile_wgs: int) -> int:
    """Values per thread in one epilogue unit: fewer than 16 only where the whole
    fragment is (tile_n = 16 with tile_m = 64)."""
    return min(_EPI_UNIT, tile_m * tile_n // (THREADS_PER_WG * tile_wgs))


def epi_slice(t: Any, s: int, shape: Any) -> Any:
    """Elements ``[s * n, (s + 1) * n)`` (``n = size(shape)``, compile-time ``s``) of
    ``t`` in its linear (colexicographic) order, as a tensor of ``shape``: the
    coordinates matching an epilogue copy ``frag[v] = t[s * n + v]``."""
    n = cute.size(shape)
    flat = cute.make_tensor(t.iterator, cute.composition(
        t.layout, cute.make_layout(cute.size(t))))
    piece = cute.logical_divide(flat, cute.make_layout(n))[(None, s)]
    return cute.make_tensor(piece.iterator, cute.composition(
        piece.layout, cute.make_layout(shape)))


class EpilogueHooks:
    """The fusion hooks of ``Sm90Gemm``: override them in a subclass (each decorated with
    ``@cute.jit``) to fuse pointwise work; see ``sm90_gemm``'s docstring."""

    _epi_slice = staticmethod(epi_slice)

    @cute.jit
    def epilogue_prefetch(self, coords, l_idx, prob_m, prob_n, mBias, epi_args):
        """Fusion hook, load phase: issue the global loads that :meth:`epilogue_op`
        will need for the sub-tile at ``coords`` and return them (register fragments;
        any value, passed back as ``prefetched``) without using the data.

        The kernel calls it one sub-tile ahead (the first sub-tile's while the tile's
        last WGMMAs run), so the loads' latency hides behind the previous sub-tile's
        store instead of stalling every sub-tile. Same coordinate rules as
        :meth:`epilogue_op`. Default: the bias values, or None; with the TMA store
        (N even) and a unit column stride, two columns per load: values 2j and 2j + 1
        are columns n and n + 1, n even (the accumulator's layout), and the load is one
        vector load wherever the bias's other strides and base let the compiler prove
        it aligned.
        """
        bias = None
        if cutlass.const_expr(mBias is not None):
            bias = self.gather_mn(mBias, coords, l_idx, prob_m, prob_n)
        return bias

    @cute.jit
    def gather_mn(self, mT, coords, l_idx, prob_m, prob_n):
        """The values of ``mT`` (an ``(M, N, L)`` view, any strides, 0 broadcasting: the
        bias, the scaled GEMM's scales) at ``coords``, clamped into the problem, as a
        register fragment of its dtype; with the TMA store (N even) and a static unit
        column stride two columns per load (see :meth:`epilogue_prefetch`)."""
        size = cute.size(coords)
        values = cute.make_rmem_tensor((size,), mT.element_type)
        column_stride = mT.layout.stride[1]
        if cutlass.const_expr(self.store == "tma" and cute.is_static(column_stride)
                              and column_stride == 1):
            for j in cutlass.range(size // 2, unroll_full=True):
                mn = coords[2 * j]
                n = cute.assume(min(mn[1], prob_n - 2), divby=2)
                offset = cute.crd2idx((min(mn[0], prob_m - 1), n, l_idx), mT.layout)
                pair = cute.make_tensor(mT.iterator + offset, cute.make_layout(2)).load()
                values[2 * j] = pair[0]
                values[2 * j + 1] = pair[1]
        else:
            for i in cutlass.range(size, unroll_full=True):
                mn = coords[i]
                values[i] = mT[min(mn[0], prob_m - 1), min(mn[1], prob_n - 1), l_idx]
        return values

    @cute.jit
    def epilogue_values(self, frag, acc, acc_up, start, released, prefetched):
        """The values :meth:`epilogue_op` transforms: ``frag[v]`` = value ``start + v``
        of the tile's result (``operands.value``: an opaque copy of the accumulator, or
        SwiGLU's ``silu(gate) * up``; ``start`` compile-time); ``prefetched`` is the
        sub-tile's (the scaled SwiGLU scales each accumulator with it first)."""
        for v in cutlass.range_constexpr(cute.size(frag)):
            frag[v] = self.operands.value(acc, acc_up, start + v, released)

    @cute.jit
    def epilogue_op(self, acc, coords, l_idx, prob_m, prob_n, mBias, alpha, beta, epi_args,
                    prefetched):
        """Fusion hook: transform one thread's fp32 fragment of a sub-tile in place.

        Called once per epilogue sub-tile (direct store: per 16-value chunk), ``acc``
        being a register copy of the sub-tile's accumulator values (never the WGMMA
        accumulator itself): ``acc[i]`` holds ``(A @ B^T)[m, n, l_idx]`` for ``(m, n) =
        coords[i]``, ``coords`` a same-shaped tensor of global coordinates;
        ``prefetched`` is what :meth:`epilogue_prefetch` returned for these coordinates.
        Every in-bounds ``(m, n)`` of the tile is seen exactly once. Coordinates may lie
        outside ``(prob_m, prob_n)`` in tail tiles; those values are discarded by the
        store but must not fault: clamp the coordinates of any gmem access into the
        problem (branch-free, and equal loads can be shared) or predicate it. Default:
        ``alpha * acc + beta * bias``, without the multiply by a factor that
        :meth:`launch` was given as the Python number 1. ``epi_args`` is passed through
        from ``__call__``.
        """
        if cutlass.const_expr(mBias is None):
            if cutlass.const_expr(self.alpha_value != 1):
                acc.store(acc.load() * alpha)
        else:
            for i in cutlass.range(cute.size(acc), unroll_full=True):
                bias = prefetched[i].to(cutlass.Float32)
                acc[i] = (self._times(acc[i], alpha, self.alpha_value)
                          + self._times(bias, beta, self.beta_value))

    @cute.jit
    def epilogue_tile_input(self, prefetched, values):
        """Fusion hook with a tile input (``launch(mTile=...)``): ``values`` holds the
        tile input at the coordinates of the sub-tile's fragment, value for value (its
        dtype, C's); return what :meth:`epilogue_op` gets as ``prefetched``, which
        :meth:`epilogue_prefetch` returned. Default: ``prefetched``."""
        return prefetched

    @staticmethod
    def _times(x, factor, value):
        """``x * factor``; ``x`` itself where ``value`` (the factor's compile-time value,
        or None) is 1."""
        return x if cutlass.const_expr(value == 1) else x * factor


class TmaStore:
    """Per sub-tile: registers -> swizzled smem (stmatrix) -> TMA store, rotating through
    ``epi_stages`` smem buffers (per consumer warpgroup with ping-pong); the store warp
    (the warpgroup's first) issues the stores. With a tile input the store warp also
    TMA-loads the input's sub-tiles into the buffers, ``ahead`` sub-tiles before the one
    being stored (across tile boundaries), each into the buffer of the store before once
    that store has been read; the consumers read it with ldmatrix in the layout stmatrix
    then overwrites."""

    def __init__(self, gemm):
        self.gemm = gemm

    def setup(self, sC, tma_c, tC, tma_t, tT, tiled_mma, frags, ctid, pp_wg, store_warp,
              split_rank):
        """The plumbing of one consumer warpgroup (while the kernel is traced); ``sC()``
        makes the store buffers' smem view."""
        gemm = self.gemm
        self.tma_c, self.tma_t = tma_c, tma_t
        self.pp_wg, self.store_warp, self.split_rank = pp_wg, store_warp, split_rank
        c_dtype, tm, tn = gemm.c_dtype, gemm.tile_m, gemm.tile_n
        self.sC = sC()
        self.gC = cute.local_tile(tC, (tm, tn), (None, None, None))
        stm_atom = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(False, 4), c_dtype)
        self.r2s = cute.make_tiled_copy_S(
            sm90_utils.get_smem_store_op(LayoutEnum.ROW_MAJOR, c_dtype, gemm.acc_dtype),
            cute.make_tiled_copy_C_atom(stm_atom, tiled_mma))
        thr_r2s = self.r2s.get_slice(ctid)
        self.tRS_sC = thr_r2s.partition_D(self.sC)             # (V, M, N, EPI_STAGE)
        self.tRS_acc = self.r2s.retile(frags.acc)               # whole tile, per thread
        self.tRS_acc_up = self.r2s.retile(frags.acc_up) if gemm.swiglu != "" else None
        self.sub_shape = cute.shape(thr_r2s.partition_S(self.sC))[:3]
        self.sub_f32 = cute.make_rmem_tensor(self.sub_shape, gemm.acc_dtype)
        self.sub_out = cute.make_rmem_tensor(self.sub_shape, c_dtype)
        self.sub_size = cute.size(self.sub_f32)
        assert self.sub_size == _EPI_UNIT, self.sub_size
        epi_m, epi_n = gemm.epi_tile
        self.subs_n = tn // epi_n
        self.num_subs = (tm // epi_m) * self.subs_n
        split = gemm.split_k
        # TMA stores per tile by this CTA (sub-tiles s with s % split == rank)
        self.subs_per_cta = (self.num_subs - split_rank + split - 1) // split
        self.epi_bar = pipeline.NamedBarrier(barrier_id=GemmBarrier.EPILOGUE_WG0 + pp_wg,
                                             num_threads=gemm.tile_threads)
        self.store_pipe = pipeline.PipelineTmaStore.create(
            num_stages=gemm.epi_stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, gemm.tile_threads),
        )
        # at most a tile's worth ahead, so that a load reaches at most the next tile
        self.ahead = min(gemm.epi_stages - 1, self.num_subs)
        self.tile_vals = None
        if cutlass.const_expr(gemm.tile_input):
            # the tile input's sub-tile, read (ldmatrix) from the store buffer its TMA
            # load filled, into the layout of sub_out: value for value
            self.s2r = cute.make_tiled_copy_S(
                cute.make_copy_atom(cute.nvgpu.warp.LdMatrix8x8x16bOp(False, 4), c_dtype),
                cute.make_tiled_copy_C_atom(stm_atom, tiled_mma))
            self.tSR_sC = self.s2r.get_slice(ctid).partition_S(self.sC)
            self.tile_vals = cute.make_rmem_tensor(self.sub_shape, c_dtype)
            self.gT = cute.local_tile(tT, (tm, tn), (None, None, None))

    def tile_coords(self, coords):
        """The tile's coordinates (``coords``, in the accumulator's layout) retiled like
        the register -> smem copy's source."""
        return self.r2s.retile(coords)

    def first_inputs(self, tile_coords, l_t, prob_m, prob_n, mBias, epi_args):
        """The first sub-tile's epilogue inputs, loaded while the last WGMMAs run (each
        later one's while its predecessor stores); None with split-K."""
        if cutlass.const_expr(self.gemm.split_k > 1):
            return None
        return self.gemm.epilogue_prefetch(epi_slice(tile_coords, 0, self.sub_shape), l_t,
                                           prob_m, prob_n, mBias, epi_args)

    @cute.jit
    def load_tile_input(self, tile_bars, tile, sub, buf):
        """TMA load of sub-tile ``sub`` of the tile input's ``tile`` (m, n, l) into store
        buffer ``buf``, completing on that buffer's mbarrier (called by the store warp)."""
        m_t, n_t, l_t = tile
        gemm = self.gemm
        sT, gT_subs = cpasync.tma_partition(
            self.tma_t, 0, cute.make_layout(1), cute.group_modes(self.sC, 0, 2),
            cute.zipped_divide(self.gT[(None, None, m_t, n_t, l_t)], gemm.epi_tile))
        with cute.arch.elect_one():
            cute.arch.mbarrier_arrive_and_expect_tx(
                tile_bars + buf, gemm.epi_tile[0] * gemm.epi_tile[1] * gemm.c_dtype.width // 8)
        cute.copy(self.tma_t, gT_subs[(None, (sub // self.subs_n, sub % self.subs_n))],
                  sT[(None, buf)], tma_bar_ptr=tile_bars + buf)

    @cute.jit
    def preload_tile_input(self, warp, tile_bars, linear):
        """The first tile's first sub-tiles of the tile input (buffers still unused)."""
        if cutlass.const_expr(self.gemm.tile_input):
            if warp == self.store_warp:
                if linear < self.gemm.walk.total:
                    first = self.gemm.walk.tile(linear)
                    for s in cutlass.range_constexpr(self.ahead):
                        self.load_tile_input(tile_bars, first, s,
                                             s + self.pp_wg * self.gemm.epi_stages)

    @cute.jit
    def store_tile(self, frags, tile, tile_coords, prob_m, prob_n, mBias, alpha, beta,
                   epi_args, upcoming, released, tiles_done, warp, tile_bars, linear, walk_stride):
        """Run the epilogue of ``tile`` (m, n, l) and store it. ``upcoming``: the first
        sub-tile's inputs (``first_inputs``); ``linear + walk_stride``: the walk index of
        this warpgroup's next tile (whose tile input may be loaded ahead). (Inside the DSL's
        branches only ``self``'s methods and DSL values are called: a plain object there
        would be carried as a branch value.)"""
        m_t, n_t, l_t = tile
        split, epi_stages = self.gemm.split_k, self.gemm.epi_stages
        sub_f32, sub_size, tile_vals = self.sub_f32, self.sub_size, self.tile_vals
        epi_bar, store_pipe = self.epi_bar, self.store_pipe
        gC_tile = cute.zipped_divide(self.gC[(None, None, m_t, n_t, l_t)], self.gemm.epi_tile)
        bSG_sC, bSG_gC = cpasync.tma_partition(
            self.tma_c, 0, cute.make_layout(1), cute.group_modes(self.sC, 0, 2), gC_tile)
        for s in cutlass.range_constexpr(self.num_subs):
            prefetched = None
            if cutlass.const_expr(split == 1):
                prefetched = upcoming
                if cutlass.const_expr(s + 1 < self.num_subs):
                    upcoming = self.gemm.epilogue_prefetch(
                        epi_slice(tile_coords, s + 1, self.sub_shape), l_t, prob_m, prob_n,
                        mBias, epi_args)
            if s % split == self.split_rank:
                sub_coords = epi_slice(tile_coords, s, self.sub_shape)
                sub_inputs = prefetched
                if cutlass.const_expr(split > 1):
                    sub_inputs = self.gemm.epilogue_prefetch(sub_coords, l_t, prob_m, prob_n,
                                                             mBias, epi_args)
                # this CTA's (s // split)-th store of the tile: consecutive stores rotate
                # through the smem buffers
                stored = tiles_done * self.subs_per_cta + s // split
                buf = stored % epi_stages
                if cutlass.const_expr(self.gemm.pingpong):
                    buf += self.pp_wg * epi_stages
                if cutlass.const_expr(self.gemm.tile_input):
                    # the tile input's sub-tile sits in the buffer this sub-tile is
                    # stored from: each thread reads, then overwrites, the same smem
                    # elements (ldmatrix / stmatrix of one layout)
                    cute.arch.mbarrier_wait(tile_bars + buf, (stored // epi_stages) % 2)
                    cute.copy(self.s2r, self.tSR_sC[(None, None, None, buf)],
                              self.s2r.retile(tile_vals))
                    sub_inputs = self.gemm.epilogue_tile_input(sub_inputs, tile_vals)
                self.gemm.epilogue_values(sub_f32, self.tRS_acc, self.tRS_acc_up,
                                          s * sub_size, released, sub_inputs)
                self.gemm.epilogue_op(sub_f32, sub_coords, l_t, prob_m, prob_n, mBias, alpha,
                                      beta, epi_args, sub_inputs)
                self.sub_out.store(sub_f32.load().to(self.gemm.c_dtype))
                cute.copy(self.r2s, self.sub_out, self.tRS_sC[(None, None, None, buf)])
                cute.arch.fence_proxy("async.shared", space="cta")
                epi_bar.arrive_and_wait()
                if warp == self.store_warp:
                    cute.copy(self.tma_c, bSG_sC[(None, buf)],
                              bSG_gC[(None, (s // self.subs_n, s % self.subs_n))],
                              cache_policy=cutlass.Int64(EVICT_NORMAL))
                    store_pipe.producer_commit()
                    store_pipe.producer_acquire()
                    self.load_ahead(tile_bars, tile, s, stored, linear, walk_stride)
                epi_bar.arrive_and_wait()

    @cute.jit
    def load_ahead(self, tile_bars, tile, s, stored, linear, walk_stride):
        """After store ``stored`` (sub-tile ``s``): the tile input's sub-tile ``ahead``
        stores on, into the buffer of store ``stored + ahead - epi_stages`` (the one
        before this store where ``ahead`` is ``epi_stages - 1``), once the TMA has read
        it; past the tile's last sub-tile, the next tile's first ones."""
        if cutlass.const_expr(self.gemm.tile_input):
            epi_stages = self.gemm.epi_stages
            cute.arch.cp_async_bulk_wait_group(epi_stages - self.ahead, read=True)
            buf_ahead = (stored + self.ahead) % epi_stages + self.pp_wg * epi_stages
            if cutlass.const_expr(s + self.ahead < self.num_subs):
                self.load_tile_input(tile_bars, tile, s + self.ahead, buf_ahead)
            else:
                if linear + walk_stride < self.gemm.walk.total:
                    self.load_tile_input(tile_bars, self.gemm.walk.tile(linear + walk_stride),
                                         s + self.ahead - self.num_subs, buf_ahead)

    @cute.jit
    def finish(self, warp):
        """After the last tile: the store warp waits for its stores."""
        if warp == self.store_warp:
            self.store_pipe.producer_tail()


class DirectStore:
    """Predicated per-element stores from registers (any N, a column-major C too), chunk
    by chunk of the fragment, each through a copy."""

    def __init__(self, gemm):
        self.gemm = gemm

    def setup(self, sC, tma_c, tC, tma_t, tT, tiled_mma, frags, ctid, pp_wg, store_warp,
              split_rank):
        self.tC, self.split_rank = tC, split_rank
        self.chunk = cute.make_rmem_tensor((self.gemm.epi_unit,), self.gemm.acc_dtype)

    def tile_coords(self, coords):
        return coords

    def first_inputs(self, tile_coords, l_t, prob_m, prob_n, mBias, epi_args):
        return None

    def preload_tile_input(self, warp, tile_bars, linear):
        pass

    @cute.jit
    def store_tile(self, frags, tile, tile_coords, prob_m, prob_n, mBias, alpha, beta,
                   epi_args, upcoming, released, tiles_done, warp, tile_bars, linear, walk_stride):
        chunk, tC, unit, l_t = self.chunk, self.tC, self.gemm.epi_unit, tile[2]
        for s in cutlass.range_constexpr(cute.size(frags.acc) // unit):
            if s % self.gemm.split_k == self.split_rank:
                chunk_coords = epi_slice(tile_coords, s, (unit,))
                inputs = self.gemm.epilogue_prefetch(chunk_coords, l_t, prob_m, prob_n, mBias,
                                                     epi_args)
                self.gemm.epilogue_values(chunk, frags.acc, frags.acc_up, s * unit, released,
                                          inputs)
                self.gemm.epilogue_op(chunk, chunk_coords, l_t, prob_m, prob_n, mBias, alpha,
                                      beta, epi_args, inputs)
                for v in cutlass.range_constexpr(unit):
                    mn = chunk_coords[v]
                    if cute.elem_less(mn, (prob_m, prob_n)):
                        tC[mn[0], mn[1], l_t] = chunk[v].to(self.gemm.c_dtype)

    def finish(self, warp):
        pass
