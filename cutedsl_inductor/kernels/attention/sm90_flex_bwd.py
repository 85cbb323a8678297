"""FlexAttention backward for Hopper (sm_90a) in CuTe DSL: dQ, dK, dV from Q, K, V, dO,
the forward's LSE and Inductor's delta = rowsum(dO * O) (less dLSE / ln 2), in two
kernels launched one after the other on the caller's stream (or, with fused dQ, one and
a cast); the only atomics are the captured tensors' gradients (below) and fused dQ's.

dK/dV kernel: one CTA per (128-row KV tile, KV head, Q batch), 3 warpgroups. Warp 0
loads K and V once (two 64-row halves each) and then, for each Q head of the KV head's
group and each Q tile of 64 rows that the BlockMask's transposed lists name
(``q_num_blocks``/``q_indices`` partial, ``full_q_*`` full), Q's and dO's tiles into a
``stages``-deep ring. Consumer warpgroup w owns KV rows ``64 (w - 1) ..``: per Q tile
S^T = K Q^T and dP^T = V dO^T (WGMMA, smem operands), P^T = exp2(score_mod(S^T
scale) log2e - LSE) (0 where masked or out of bounds), dV += P^T dO, dS^T = joint(P^T
(dP^T - delta)) (0 where masked), dK += dS^T Q (A from registers; dO and Q as
MN-major B through a transposed view of their tiles). Pipelined (``FlexBwdConfig.pipelined``):
S^T and dP^T are commit groups of their own, P^T is computed while dP^T runs and dV's
GEMM is issued before dS^T is computed, so each elementwise pass overlaps a GEMM (no
register an in-flight WGMMA reads or writes is touched before its wait); serial: both
waited for, then both elementwise passes, then both GEMMs. The end stores dK * scale and dV
(rows below KV_LEN) into the (Q batch, KV head) slices: a broadcast KV batch is summed
by Inductor's lowering, GQA's Q heads inside the CTA. Longest first
(``FlexBwdConfig.lpt``): a 1-D grid in ``parts.longest_first``'s order, so that under a
causal mask the CTAs with the most Q steps start first. Each Q tile's LSE and delta go
through shared memory, a row of Q_STEP pairs per consumer warp (staged by the warp's own
lanes between two warp syncs, once the tile's GEMMs are issued), not in registers: at head
dim 128 the consumer's dK, dV, S^T, dP^T, P^T and dS^T fill its 240 registers. Early S^T
(``FlexBwdConfig.early_s``, pipelined two-kernel only): a step ends with dV's and dK's
GEMMs in flight; the next step issues S^T, then waits for them and releases their stage,
so the tensor cores do not drain between steps.

dQ kernel: one CTA per (128-row Q tile, Q head, batch), the forward's shape and
BlockMask walk (``kv_num_blocks``/``kv_indices``, full blocks): Q and dO resident, K and V
in a ring of 64-row tiles; S = Q K^T, dP = dO V^T, dS as above, dQ += dS K (K as MN-major
B through a transposed view); dQ * scale stored (rows below Q_LEN).

Fused dQ (``FlexBwdConfig.fused_dq``): the dK/dV kernel computes dQ too, and the dQ
kernel (with its recomputed S and dP) is not run. Per Q step both warpgroups' dS^T go
into the stage's dS tile (stmatrix, then a barrier of both), each warpgroup issues the
GEMM of its half of the head dim (dQ = dS K) before dK's, and while dK's runs writes the
dQ half to its fp32 tile in shared memory, and one TMA reduce-add puts the half into a
zeroed fp32 workspace (B, H, Q_LEN, D); a
cast kernel then writes dQ * scale. Reduce-adds of different CTAs to the same rows are
atomic in L2: their order, and so dQ's last bits, vary between runs.
Plain scores (``plain_scores``: the score_mod is the identity and its gradient the incoming
one): P^T is computed once and kept in fp32, dS^T = P^T (dP^T - delta) with no second
exp2 (else the score's gradient needs the post-mod score, recomputed). Only partial tiles
and tiles crossing Q_LEN or KV_LEN apply mask_mod and the bounds; interior full tiles skip
both.

Invariants: LSE is in log2 units, as the forward stores it (``Sm90FlexAttention``): P =
exp2(post_mod * log2e - LSE); a row's LSE of -inf (no key reached it) reads as 0, so
its P is 0, as in Inductor's Triton backward. Elements outside (Q_LEN, KV_LEN) and
masked ones get P = 0 and dS = 0 whatever score_mod or its gradient make of them; the
hooks see in-range indices only (an index past its length is given as 0), so their
captured reads need no guard. Every element of dQ, dK, dV is
written (zeros where no block is listed).

Hooks (the template overrides them): ``score_mod`` and ``mask_mod`` as the forward's,
``joint_mod(score, grad, b, h, q_idx, kv_idx, in_bounds, captures)`` -> Float32: the
gradient w.r.t. the pre-mod score, given ``grad`` w.r.t. the post-mod score;
``grad_captures(score, grad, b, h, q_idx, kv_idx, keep, captures)`` (where
``captured_grads``): fp32 atomic adds of the element's share of the captured tensors'
gradients into their (zeroed) buffers. Only the dK/dV kernel calls it, once per element
it visits -- every (b, h, q_idx, kv_idx) of a listed block exactly once, GQA's Q heads
and a broadcast KV batch included -- and only for kept ones (in bounds, mask_mod True),
so nothing is counted twice or outside the problem; the dQ kernel adds nothing.

Failure semantics: a ``FlexBwdConfig`` that cannot run raises ``ValueError`` at
construction; operand dtypes or head dims the kernels cannot take raise ``ValueError``
while tracing (the choice is then dropped).
"""

# No ``from __future__ import annotations``: ``cute.struct`` reads annotations as types.
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.memory import SmemAllocator
from cutlass.tensor_utils import LayoutEnum

from .bwd_config import KV_STEP, KV_TILE, LPT_L2_BYTES, Q_STEP, Q_TILE, FlexBwdConfig
from ..sm90 import THREADS_PER_WG, WGMMA_M, FlexBwdBarrier
from .parts import (
    LOG2E,
    as_a_operand,
    block_list,
    in_range,
    longest_first,
    lpt_section,
    walk_length,
    walk_tile,
)

CONSUMER_WARPS = 8  # two consumer warpgroups
CAST_THREADS = 256  # the fused dQ's cast kernel: threads per CTA

__all__ = ["Sm90FlexBackward"]


def _transposed(tensor):
    """The first two modes of an smem tensor swapped: a K-major tile read as MN-major."""
    shape = (tensor.shape[1], tensor.shape[0], *tensor.shape[2:])
    order = (1, 0, *range(2, cute.rank(tensor)))
    return cute.composition(tensor, cute.make_ordered_layout(shape, order=order))


def _pipeline(bars, stages, tx_bytes):
    return pipeline.PipelineTmaAsync.create(
        barrier_storage=bars, num_stages=stages,
        producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
        consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 2 * THREADS_PER_WG),
        tx_count=tx_bytes, cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)),
        enable_multicast_signaling=True)


def _tma(tensor, smem_layout, rows, d):
    atom, gmem = cpasync.make_tiled_tma_atom(
        cpasync.CopyBulkTensorTileG2SOp(), tensor, cute.slice_(smem_layout, (None, None, 0)),
        (rows, d))
    return atom, gmem


def _partition(atom, smem, gmem, rows, d):
    """(smem, gmem) TMA partitions of an (rows, d) tiling."""
    return cpasync.tma_partition(
        atom, 0, cute.make_layout(1), cute.group_modes(smem, 0, 2),
        cute.group_modes(cute.local_tile(gmem, (rows, d), (None, None, None)), 0, 2))


class Sm90FlexBackward:
    """``Sm90FlexBackward(config)(q, k, v, lse, delta, do, dq, dk, dv, q_num, q_idx,
    full_q_num, full_q_idx, kv_num, kv_idx, full_kv_num, full_kv_idx, captures,
    stream)``; see the module docstring."""

    def __init__(self, config: FlexBwdConfig):
        self.config = config
        self.head_dim = config.head_dim
        self.stages = config.stages
        self.num_threads = 3 * THREADS_PER_WG
        self.producer_regs = 24
        self.consumer_regs = 240

    # -------------------------------------------------------------- the hooks
    @cute.jit
    def score_mod(self, score, b_idx, h_idx, q_idx, kv_idx, in_bounds, captures):
        return score

    @cute.jit
    def joint_mod(self, score, grad, b_idx, h_idx, q_idx, kv_idx, in_bounds, captures):
        return grad

    @cute.jit
    def mask_mod(self, b_idx, h_idx, q_idx, kv_idx, in_bounds, captures):
        return cutlass.Boolean(True)

    captured_grads = False  # whether grad_captures adds anything (the template says)
    # the score_mod and its gradient are identities (the template says): P is computed
    # once and kept in fp32 for dS
    plain_scores = False

    @cute.jit
    def grad_captures(self, score, grad, b_idx, h_idx, q_idx, kv_idx, keep, captures):
        """Add this element's share of the captured tensors' gradients (where ``keep``)."""

    # ------------------------------------------------------------- host entry
    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mLSE: cute.Tensor,
                 mDelta: cute.Tensor, mdO: cute.Tensor, mdQ: cute.Tensor, mdK: cute.Tensor,
                 mdV: cute.Tensor, q_num: cute.Tensor, q_idx: cute.Tensor,
                 full_q_num: cute.Tensor, full_q_idx: cute.Tensor, kv_num: cute.Tensor,
                 kv_idx: cute.Tensor, full_kv_num: cute.Tensor, full_kv_idx: cute.Tensor,
                 captures, stream, mdQaccum=None):
        dtype = mQ.element_type
        if cutlass.const_expr(dtype not in (cutlass.BFloat16, cutlass.Float16)
                              or mK.element_type != dtype or mV.element_type != dtype
                              or mdO.element_type != dtype):
            raise ValueError("Sm90FlexBackward: Q, K, V, dO must be one of bf16/fp16")
        self.dtype = dtype
        batch, heads, q_len, d = mQ.shape
        kv_batch, kv_heads, kv_len, _ = mK.shape
        if cutlass.const_expr(d != self.head_dim or mV.shape[3] != self.head_dim):
            raise ValueError(f"Sm90FlexBackward: head dims must be {self.head_dim}")
        # static sizes (the template compiles per shape)
        self.q_len, self.kv_len, self.heads, self.kv_heads = q_len, kv_len, heads, kv_heads
        self.group = heads // kv_heads
        major_k, major_mn = cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.MN
        mma_ss = sm90_utils.make_trivial_tiled_mma(dtype, dtype, major_k, major_k,
                                                   cutlass.Float32, (1, 1, 1), (WGMMA_M, 64))
        mma_rs = sm90_utils.make_trivial_tiled_mma(dtype, dtype, major_k, major_mn,
                                                   cutlass.Float32, (1, 1, 1), (WGMMA_M, d),
                                                   warpgroup.OperandSource.RMEM)
        # 128-row resident tiles as A operands (two 64-row halves), 64-row ring tiles as B
        resident = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, (WGMMA_M, 64, d), dtype, 2)
        ring = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, (WGMMA_M, 64, d), dtype,
                                             self.stages)
        self.tile_bytes = cute.size_in_bytes(dtype, cute.slice_(ring, (None, None, 0)))
        # fused dQ: each stage's dS tile (Q_STEP x KV_TILE, as two 64-column halves), the A
        # operand of dQ = dS K, queries contiguous (written from the dS^T registers)
        ds_layout = sm90_utils.make_smem_layout_a(LayoutEnum.COL_MAJOR, (Q_STEP, 64, 64),
                                                  dtype, 2 * self.stages)
        # and each consumer warpgroup's half of a Q step's dQ, fp32, staged for the TMA
        dq_layout = sm90_utils.make_smem_layout_epi(cutlass.Float32, LayoutEnum.ROW_MAJOR,
                                                    (Q_STEP, d // 2), 2)
        self._define_smem(dtype, resident, ring, ds_layout, dq_layout)
        q_views = [self._rows_view(t, q_len, heads, batch) for t in (mQ, mdO)]
        # dK/dV: K and V resident, Q and dO in the ring; Q tiles walked per KV tile
        self.q_steps_per_block = min(self.config.sparse_q_block // Q_STEP,
                                     (q_len + Q_STEP - 1) // Q_STEP)
        kv_views = [self._kv_view(t, kv_len, kv_heads, batch, kv_batch, 1) for t in (mK, mV)]
        tmas = [x for t in kv_views for x in _tma(t, resident, WGMMA_M, d)]
        tmas += [x for t in q_views for x in _tma(t, ring, Q_STEP, d)]
        dkdv_args = (*tmas, mdK, mdV, mLSE, mDelta, q_num, q_idx, full_q_num, full_q_idx,
                     captures, mma_ss, mma_rs, resident, ring)
        self.kv_tiles = (kv_len + KV_TILE - 1) // KV_TILE
        grid = [self.kv_tiles, kv_heads, batch]
        if cutlass.const_expr(self.config.lpt):
            # each CTA walks the Q and dO tiles of its KV head's group of Q heads
            head_bytes = self.group * q_len * d * 2 * self.config.element_bytes
            self.lpt_section = lpt_section(head_bytes, kv_heads * batch, LPT_L2_BYTES)
            grid = [self.kv_tiles * kv_heads * batch, 1, 1]
        dkdv_launch = dict(grid=grid, block=[self.num_threads, 1, 1], min_blocks_per_mp=1,
                           stream=stream)
        if cutlass.const_expr(self.config.fused_dq):
            # dQ's fp32 accumulator, the zeroed workspace as (B, H, Q_LEN, D)
            accum = cute.make_tensor(mdQaccum.iterator, cute.make_layout(
                (batch, heads, q_len, d), stride=(heads * q_len * d, q_len * d, d, 1)))
            # dQ = dS K: the Q step's dS (A, queries contiguous) and K^T (B, MN-major), the
            # head dim split between the consumer warpgroups
            mma_dq = sm90_utils.make_trivial_tiled_mma(dtype, dtype, major_mn, major_mn,
                                                       cutlass.Float32, (1, 2, 1),
                                                       (WGMMA_M, d // 2))
            # a half's reduce-add clips the rows past Q_LEN (no other head's rows touched)
            tma_dq, g_dq = cpasync.make_tiled_tma_atom(
                cpasync.CopyReduceBulkTensorTileS2GOp(),
                self._rows_view(accum, q_len, heads, batch),
                cute.slice_(dq_layout, (None, None, 0)), (Q_STEP, d // 2))
            self.kernel_dkdvq(*dkdv_args, tma_dq, g_dq, mma_dq, ds_layout,
                              dq_layout).launch(**dkdv_launch)
            self.cast_dq(accum, mdQ, stream)
            return
        self.kernel_dkdv(*dkdv_args).launch(**dkdv_launch)
        # dQ: Q and dO resident, K and V in the ring; KV tiles walked per Q tile
        self.kv_steps_per_block = min(self.config.sparse_kv_block // KV_STEP,
                                      (kv_len + KV_STEP - 1) // KV_STEP)
        kv_views = [self._kv_view(t, kv_len, kv_heads, batch, kv_batch, self.group)
                    for t in (mK, mV)]
        tmas = [x for t in q_views for x in _tma(t, resident, WGMMA_M, d)]
        tmas += [x for t in kv_views for x in _tma(t, ring, KV_STEP, d)]
        self.kernel_dq(*tmas, mdQ, mLSE, mDelta, kv_num, kv_idx, full_kv_num, full_kv_idx,
                       captures, mma_ss, mma_rs, resident, ring).launch(
            grid=[(q_len + Q_TILE - 1) // Q_TILE, heads, batch],
            block=[self.num_threads, 1, 1], min_blocks_per_mp=1, stream=stream)

    @staticmethod
    def _rows_view(t, rows, heads, batch):
        """(S, D, (H, B)) of a (B, H, S, D) tensor."""
        return cute.make_tensor(t.iterator, cute.make_layout(
            (rows, t.shape[3], (heads, batch)),
            stride=(t.stride[2], 1, (t.stride[1], t.stride[0]))))

    @staticmethod
    def _kv_view(t, rows, kv_heads, batch, kv_batch, group):
        """(S, D, ((G, H_kv), B)) of a (B_kv, H_kv, S, D) tensor: G Q heads per KV head
        (0 stride), a KV batch of 1 broadcast to B."""
        b_stride = 0 if kv_batch == 1 else t.stride[0]
        return cute.make_tensor(t.iterator, cute.make_layout(
            (rows, t.shape[3], ((group, kv_heads), batch)),
            stride=(t.stride[2], 1, ((0, t.stride[1]), b_stride))))

    def _define_smem(self, dtype, resident, ring, ds_layout, dq_layout):
        stages = self.stages
        fused = self.config.fused_dq
        ds_elems = cute.cosize(ds_layout) if fused else 0
        dq_elems = cute.cosize(dq_layout) if fused else 0

        @cute.struct
        class BwdSmem:
            resident_bars: cute.struct.MemRange[cutlass.Int64, 2]
            ring_bars: cute.struct.MemRange[cutlass.Int64, stages * 2]
            sA0: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(resident)], 1024]
            sA1: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(resident)], 1024]
            sB0: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(ring)], 1024]
            sB1: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(ring)], 1024]
            # each consumer warp's LSE and delta of its Q tile (the dK/dV kernel's)
            stats: cute.struct.Align[cute.struct.MemRange[cutlass.Float32,
                                                          CONSUMER_WARPS * 2 * Q_STEP], 16]
            # the fused dQ's dS tiles and dQ halves (empty without it)
            sdS: cute.struct.Align[cute.struct.MemRange[dtype, ds_elems], 1024]
            sdQ: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, dq_elems], 1024]

        self.smem_struct = BwdSmem

    def _smem(self, resident, ring, fused_layouts=None):
        """(resident pipeline, ring pipeline, the two resident and two ring tensors, the
        stats rows: (Q_STEP, (LSE | delta, consumer warp)), the fused dQ's (dS tiles, dQ
        halves) where ``fused_layouts`` gives their layouts, else None)."""
        smem = SmemAllocator().allocate(self.smem_struct)
        fused = None
        if fused_layouts is not None:
            ds_layout, dq_layout = fused_layouts
            fused = (smem.sdS.get_tensor(ds_layout.outer, swizzle=ds_layout.inner),
                     smem.sdQ.get_tensor(dq_layout.outer, swizzle=dq_layout.inner))
        return (_pipeline(smem.resident_bars.data_ptr(), 1, 4 * self.tile_bytes),
                _pipeline(smem.ring_bars.data_ptr(), self.stages, 2 * self.tile_bytes),
                smem.sA0.get_tensor(resident.outer, swizzle=resident.inner),
                smem.sA1.get_tensor(resident.outer, swizzle=resident.inner),
                smem.sB0.get_tensor(ring.outer, swizzle=ring.inner),
                smem.sB1.get_tensor(ring.outer, swizzle=ring.inner),
                smem.stats.get_tensor(cute.make_layout((Q_STEP, (2, CONSUMER_WARPS)))),
                fused)

    # ------------------------------------------------------- BlockMask walk
    @cute.jit
    def blocks_of(self, lists, tile, rows, sparse_block, h_idx, b_idx):
        return block_list(lists, self.config.has_full_blocks, tile, rows, sparse_block, h_idx,
                          b_idx)

    @cute.jit
    def tile_of(self, blocks, t, per_block, steps):
        """The tile index of step ``t`` of a walk, and whether its block is partial."""
        return walk_tile(blocks, self.config.has_full_blocks, t, per_block, steps)

    # ------------------------------------------------------------- producers
    @cute.jit
    def load_resident(self, pipe, tma_a, g_a, tma_b, g_b, s_a, s_b, tile, l_idx):
        """Both 128-row resident tiles (two 64-row halves each) into the one stage."""
        d = self.head_dim
        pa_s, pa_g = _partition(tma_a, s_a, g_a, WGMMA_M, d)
        pb_s, pb_g = _partition(tma_b, s_b, g_b, WGMMA_M, d)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
        pipe.producer_acquire(state)
        bar = pipe.producer_get_barrier(state)
        for half in cutlass.range_constexpr(2):
            cute.copy(tma_a, pa_g[(None, 2 * tile + half, 0, l_idx)], pa_s[(None, half)],
                      tma_bar_ptr=bar)
            cute.copy(tma_b, pb_g[(None, 2 * tile + half, 0, l_idx)], pb_s[(None, half)],
                      tma_bar_ptr=bar)
        pipe.producer_commit(state)

    @cute.jit
    def load_ring(self, pipe, state, parts, row_tile, l_idx):
        """One stage of the ring: the two 64-row tiles at ``row_tile``."""
        tma_a, pa_s, pa_g, tma_b, pb_s, pb_g = parts
        pipe.producer_acquire(state)
        bar = pipe.producer_get_barrier(state)
        cute.copy(tma_a, pa_g[(None, row_tile, 0, l_idx)], pa_s[(None, state.index)],
                  tma_bar_ptr=bar)
        cute.copy(tma_b, pb_g[(None, row_tile, 0, l_idx)], pb_s[(None, state.index)],
                  tma_bar_ptr=bar)
        pipe.producer_commit(state)

    def ring_parts(self, tma_a, s_a, g_a, tma_b, s_b, g_b):
        d = self.head_dim
        pa_s, pa_g = _partition(tma_a, s_a, g_a, 64, d)
        pb_s, pb_g = _partition(tma_b, s_b, g_b, 64, d)
        return tma_a, pa_s, pa_g, tma_b, pb_s, pb_g

    # ---------------------------------------------------------- elementwise
    @cute.jit
    def keep_scores(self, acc_s, rP, cS, lse, transposed, is_partial, edge, q_base, kv_base,
                    b_idx, h_idx, captures):
        """acc_s <- P where ``plain_scores``, else the scaled score where kept (in bounds,
        mask_mod True in partial blocks) and -inf elsewhere; rP (where given) <- P in the
        input dtype. The mask and the bounds are worked out only in a partial block's
        tile or one reaching past Q_LEN or KV_LEN (``edge``), chosen once per tile, not
        per element, so that a row's (a column's) captured reads are one load, shared."""
        args = (acc_s, rP, cS, lse, transposed, is_partial, q_base, kv_base, b_idx, h_idx,
                captures)
        if is_partial | edge:
            self.keep_tile_scores(*args, True)
        else:
            self.keep_tile_scores(*args, False)

    @cute.jit
    def keep_tile_scores(self, acc_s, rP, cS, lse, transposed, is_partial, q_base, kv_base,
                         b_idx, h_idx, captures, checked: cutlass.Constexpr):
        """``keep_scores`` of a tile that needs the mask or the bounds (``checked``), or of
        a full block's tile inside both lengths (every element kept)."""
        scale = self.config.sm_scale
        neg_inf = -cutlass.Float32.inf
        for i in cutlass.range_constexpr(cute.size(acc_s)):
            q_idx, kv_idx = self._coords(cS[i], transposed, q_base, kv_base)
            in_bounds = cutlass.Boolean(True)
            keep = cutlass.Boolean(True)
            if cutlass.const_expr(checked):
                in_bounds, q_idx, kv_idx = self._in_range(q_idx, kv_idx)
                keep = in_bounds & (self.mask_mod(b_idx, h_idx, q_idx, kv_idx, in_bounds,
                                                  captures) | ~is_partial)
            lse_i = lse[self._stat(i, transposed)]
            if cutlass.const_expr(self.plain_scores):
                arg = acc_s[i] * (scale * LOG2E)
                if cutlass.const_expr(checked):
                    arg = cutlass.select_(keep, arg, neg_inf)
                acc_s[i] = cute.math.exp2(arg - lse_i, fastmath=True)
                if cutlass.const_expr(rP is not None):
                    rP[i] = acc_s[i].to(self.dtype)
            else:
                pre = acc_s[i] * scale
                if cutlass.const_expr(rP is not None):
                    arg = self.score_mod(pre, b_idx, h_idx, q_idx, kv_idx, in_bounds,
                                         captures) * LOG2E
                    if cutlass.const_expr(checked):
                        arg = cutlass.select_(keep, arg, neg_inf)
                    rP[i] = cute.math.exp2(arg - lse_i, fastmath=True).to(self.dtype)
                if cutlass.const_expr(checked):
                    pre = cutlass.select_(keep, pre, neg_inf)
                acc_s[i] = pre

    @cute.jit
    def score_grads(self, acc_s, acc_dp, cS, lse, delta, transposed, q_base, kv_base, b_idx,
                    h_idx, captures, add_grads):
        """acc_dp <- dS: P (dP - delta) where ``plain_scores`` (acc_s holds P, 0 where not
        kept), else joint(P (dP - delta)) where kept (acc_s > -inf) and 0 elsewhere; with
        ``add_grads`` (the dK/dV kernel's, constexpr) each kept element's share of the
        captured tensors' gradients is added too."""
        if cutlass.const_expr(self.plain_scores):
            for i in cutlass.range_constexpr(cute.size(acc_s)):
                acc_dp[i] = acc_s[i] * (acc_dp[i] - delta[self._stat(i, transposed)])
        else:
            self.modified_score_grads(acc_s, acc_dp, cS, lse, delta, transposed, q_base,
                                      kv_base, b_idx, h_idx, captures, add_grads)

    @cute.jit
    def modified_score_grads(self, acc_s, acc_dp, cS, lse, delta, transposed, q_base, kv_base,
                             b_idx, h_idx, captures, add_grads):
        """``score_grads`` through the score_mod and its gradient: P recomputed from the
        kept scaled score."""
        neg_inf = -cutlass.Float32.inf
        for i in cutlass.range_constexpr(cute.size(acc_s)):
            in_bounds, q_idx, kv_idx = self._in_range(
                *self._coords(cS[i], transposed, q_base, kv_base))
            pre = acc_s[i]
            keep = pre > neg_inf
            post = self.score_mod(pre, b_idx, h_idx, q_idx, kv_idx, in_bounds, captures)
            k = self._stat(i, transposed)
            p = cute.math.exp2(cutlass.select_(keep, post * LOG2E, neg_inf) - lse[k],
                               fastmath=True)
            ds = p * (acc_dp[i] - delta[k])
            grad = self.joint_mod(pre, ds, b_idx, h_idx, q_idx, kv_idx, in_bounds, captures)
            if cutlass.const_expr(add_grads and self.captured_grads):
                self.grad_captures(pre, ds, b_idx, h_idx, q_idx, kv_idx, keep, captures)
            acc_dp[i] = cutlass.select_(keep, grad, cutlass.Float32(0.0))

    def _in_range(self, q_idx, kv_idx):
        """(in_bounds, q_idx, kv_idx) with each index in range (``in_range``)."""
        q_in, q_idx = in_range(q_idx, self.q_len)
        kv_in, kv_idx = in_range(kv_idx, self.kv_len)
        return q_in & kv_in, q_idx, kv_idx

    @staticmethod
    def _coords(crd, transposed, q_base, kv_base):
        """(q_idx, kv_idx) of an accumulator coordinate: rows are KV where ``transposed``."""
        q_crd, kv_crd = (crd[1], crd[0]) if transposed else (crd[0], crd[1])
        return cutlass.Int32(q_base + q_crd), cutlass.Int32(kv_base + kv_crd)

    @staticmethod
    def _stat(i, transposed):
        """The index, into a thread's per-query LSE/delta, of accumulator value ``i``
        (value layout stride (1, 2, 4): the column pair, the row 8 below, the 8-column
        block): a column's where the queries are columns, else a row's."""
        return (i % 2) + 2 * (i // 4) if transposed else (i // 2) % 2

    @cute.jit
    def load_stats(self, mLSE, mDelta, cS, q_base, b_idx, h_idx, lse, delta):
        """The LSE and delta of this thread's two query rows of an S tile (the dQ
        kernel's), as ``row_stats`` reads them."""
        for k in cutlass.range_constexpr(cute.size(lse)):
            q_idx, _ = self._coords(cS[2 * k], False, q_base, 0)
            lse[k], delta[k] = self.row_stats(mLSE, mDelta, b_idx, h_idx, q_idx)

    @cute.jit
    def stage_stats(self, mLSE, mDelta, q_base, b_idx, h_idx, s_stats):
        """The warp's stats rows <- the ``row_stats`` of the Q tile at ``q_base``, two rows
        a lane. The warp's reads of the previous tile's rows are behind the first
        ``sync_warp``, its writes before the second."""
        cute.arch.sync_warp()
        for j in cutlass.range_constexpr(Q_STEP // 32):
            col = cute.arch.lane_idx() + 32 * j
            s_stats[col, 0], s_stats[col, 1] = self.row_stats(mLSE, mDelta, b_idx, h_idx,
                                                              q_base + col)
        cute.arch.sync_warp()

    @cute.jit
    def row_stats(self, mLSE, mDelta, b_idx, h_idx, q_idx):
        """(LSE, delta) of query row ``q_idx``: an LSE of -inf (no key reached the row) read
        as 0, both 0 past Q_LEN."""
        inside = q_idx < self.q_len
        q_idx = cutlass.select_(inside, q_idx, cutlass.Int32(0))
        zero = cutlass.Float32(0.0)
        lse = cutlass.select_(inside, cutlass.Float32(mLSE[b_idx, h_idx, q_idx]), zero)
        delta = cutlass.select_(inside, cutlass.Float32(mDelta[b_idx, h_idx, q_idx]), zero)
        return cutlass.select_(lse == -cutlass.Float32.inf, zero, lse), delta

    @staticmethod
    def thread_stats(row, cS):
        """A stats row as this thread's 16 values of the transposed S^T tile, indexed as
        ``_stat`` indexes them: column pairs (2 c, 2 c + 1) of the 8 8-column blocks,
        from the thread's first column on."""
        return cute.make_tensor(row.iterator + cS[0][1],
                                cute.make_layout((2, Q_STEP // 8), stride=(1, 8)))

    @cute.jit
    def store_rows(self, acc, coords, out, row_base, rows, b_idx, h_idx, scale):
        """acc * scale (input dtype) into out[b, h, row, :] for rows below ``rows``;
        ``coords``: the accumulator's (row, column)s, partitioned before the mainloop (its
        MMA's accumulate field is rebound inside)."""
        if cutlass.const_expr(acc.layout.stride[0] != (1, 2, 4)):
            raise ValueError(f"Sm90FlexBackward: accumulator layout {acc.layout}")
        for i in cutlass.range_constexpr(cute.size(acc)):
            crd = coords[i]
            row = row_base + crd[0]
            if row < rows:
                out[b_idx, h_idx, row, crd[1]] = (acc[i] * scale).to(self.dtype)

    @cute.jit
    def gemm_ss(self, mma, acc, frag_a, a_index, frag_b, b_index):
        """acc = A B (smem operands), issued, not waited for."""
        for kb in cutlass.range_constexpr(cute.size(frag_a, mode=[2])):
            mma.set(warpgroup.Field.ACCUMULATE, kb != 0)
            cute.gemm(mma, acc, frag_a[(None, None, kb, a_index)],
                      frag_b[(None, None, kb, b_index)], acc)

    @cute.jit
    def gemm_rs(self, mma, acc, values, frag_b, b_index):
        """acc += A B, A the 64 x 64 registers ``values`` (input dtype); issued."""
        frag_a = cute.make_tensor(values.iterator, as_a_operand(values.layout, 64))
        mma.set(warpgroup.Field.ACCUMULATE, True)
        for kb in cutlass.range_constexpr(64 // 16):
            cute.gemm(mma, acc, frag_a[(None, None, kb)], frag_b[(None, None, kb, b_index)], acc)

    # ---------------------------------------------------------- dK/dV kernel
    @cute.kernel
    def kernel_dkdv(self, tma_k: cute.CopyAtom, g_k: cute.Tensor, tma_v: cute.CopyAtom,
                    g_v: cute.Tensor, tma_q: cute.CopyAtom, g_q: cute.Tensor,
                    tma_do: cute.CopyAtom, g_do: cute.Tensor, mdK: cute.Tensor,
                    mdV: cute.Tensor, mLSE: cute.Tensor, mDelta: cute.Tensor,
                    q_num: cute.Tensor, q_idx: cute.Tensor, full_q_num: cute.Tensor,
                    full_q_idx: cute.Tensor, captures, mma_ss: cute.TiledMma,
                    mma_rs: cute.TiledMma, resident: cute.ComposedLayout,
                    ring: cute.ComposedLayout):
        self.dkdv_body((tma_k, g_k, tma_v, g_v, tma_q, g_q, tma_do, g_do), mdK, mdV, mLSE,
                       mDelta, (q_num, q_idx, full_q_num, full_q_idx), captures, mma_ss, mma_rs,
                       resident, ring, None)

    @cute.kernel
    def kernel_dkdvq(self, tma_k: cute.CopyAtom, g_k: cute.Tensor, tma_v: cute.CopyAtom,
                     g_v: cute.Tensor, tma_q: cute.CopyAtom, g_q: cute.Tensor,
                     tma_do: cute.CopyAtom, g_do: cute.Tensor, mdK: cute.Tensor,
                     mdV: cute.Tensor, mLSE: cute.Tensor, mDelta: cute.Tensor,
                     q_num: cute.Tensor, q_idx: cute.Tensor, full_q_num: cute.Tensor,
                     full_q_idx: cute.Tensor, captures, mma_ss: cute.TiledMma,
                     mma_rs: cute.TiledMma, resident: cute.ComposedLayout,
                     ring: cute.ComposedLayout, tma_dq: cute.CopyAtom, g_dq: cute.Tensor,
                     mma_dq: cute.TiledMma, ds_layout: cute.ComposedLayout,
                     dq_layout: cute.ComposedLayout):
        """The dK/dV kernel that also adds each Q step's dS K into dQ's fp32 accumulator
        (``g_dq``, through ``tma_dq``)."""
        self.dkdv_body((tma_k, g_k, tma_v, g_v, tma_q, g_q, tma_do, g_do), mdK, mdV, mLSE,
                       mDelta, (q_num, q_idx, full_q_num, full_q_idx), captures, mma_ss, mma_rs,
                       resident, ring, (tma_dq, g_dq, mma_dq, ds_layout, dq_layout))

    @cute.jit
    def dkdv_body(self, loads, mdK, mdV, mLSE, mDelta, sparse, captures, mma_ss, mma_rs,
                  resident, ring, dq):
        """Warp 0 loads, the consumer warpgroups compute; ``dq``: None, or the fused dQ's
        (TMA atom, accumulator, MMA, dS and dQ smem layouts)."""
        tma_k, g_k, tma_v, g_v, tma_q, g_q, tma_do, g_do = loads
        tidx, _, _ = cute.arch.thread_idx()
        n_tile, hkv, b_idx = self.dkdv_tile()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp == 0:
            for atom in (tma_k, tma_v, tma_q, tma_do):
                cpasync.prefetch_descriptor(atom)
            if cutlass.const_expr(dq is not None):
                cpasync.prefetch_descriptor(dq[0])
        kv_pipe, q_pipe, sK, sV, sQ, sdO, s_stats, fused_smem = self._smem(
            resident, ring, dq[3:] if cutlass.const_expr(dq is not None) else None)
        if warp // 4 == 0:
            cute.arch.setmaxregister_decrease(self.producer_regs)
            if warp == 0:
                self.load_resident(kv_pipe, tma_k, g_k, tma_v, g_v, sK, sV, n_tile,
                                   hkv + self.kv_heads * b_idx)
                parts = self.ring_parts(tma_q, sQ, g_q, tma_do, sdO, g_do)
                state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                                     self.stages)
                for g in cutlass.range(self.group, unroll=1):
                    h_idx = hkv * self.group + g
                    blocks = self.blocks_of(sparse, n_tile, KV_TILE,
                                            self.config.sparse_kv_block, h_idx, b_idx)
                    for t in cutlass.range(walk_length(blocks, self.q_steps_per_block),
                                           unroll=1):
                        m_tile, _ = self.tile_of(blocks, t, self.config.sparse_q_block // Q_STEP,
                                                 self.q_steps_per_block)
                        self.load_ring(q_pipe, state, parts, m_tile, h_idx + self.heads * b_idx)
                        state.advance()
                q_pipe.producer_tail(state)
        else:
            cute.arch.setmaxregister_increase(self.consumer_regs)
            stats = s_stats[None, (None, warp - 4)]
            fused = None
            if cutlass.const_expr(dq is not None):
                fused = self.dq_parts(dq[0], dq[1], dq[2], mma_ss, fused_smem, sK, tidx)
            self.consumer_dkdv(kv_pipe, q_pipe, (sK, sV, sQ, sdO), mma_ss, mma_rs, tidx,
                               n_tile, hkv, b_idx, mdK, mdV, (mLSE, mDelta, stats), sparse,
                               captures, fused)

    @cute.jit
    def dkdv_tile(self):
        """(KV tile, KV head, batch) of this CTA: the grid's, or in the longest-first order
        (``FlexBwdConfig.lpt``) that of its place in the 1-D grid."""
        if cutlass.const_expr(self.config.lpt):
            linear, _, _ = cute.arch.block_idx()
            n_tile, head = longest_first(linear, self.kv_tiles, self.lpt_section)
            b_idx = head // self.kv_heads
            return n_tile, head - b_idx * self.kv_heads, b_idx
        return cute.arch.block_idx()

    @cute.jit
    def consumer_dkdv(self, kv_pipe, q_pipe, tiles, mma_ss, mma_rs, tidx, n_tile, hkv, b_idx,
                      mdK, mdV, stats, sparse, captures, fused):
        sK, sV, sQ, sdO = tiles
        wg = tidx // THREADS_PER_WG
        ss_thr = mma_ss.get_slice(tidx % THREADS_PER_WG)
        rs_thr = mma_rs.get_slice(tidx % THREADS_PER_WG)
        frags = (mma_ss.make_fragment_A(ss_thr.partition_A(sK)),
                 mma_ss.make_fragment_A(ss_thr.partition_A(sV)),
                 mma_ss.make_fragment_B(ss_thr.partition_B(sQ)),
                 mma_ss.make_fragment_B(ss_thr.partition_B(sdO)),
                 mma_rs.make_fragment_B(rs_thr.partition_B(_transposed(sQ))),
                 mma_rs.make_fragment_B(rs_thr.partition_B(_transposed(sdO))))
        acc_dk = cute.make_rmem_tensor(rs_thr.partition_shape_C((WGMMA_M, self.head_dim)),
                                       cutlass.Float32)
        acc_dv = cute.make_rmem_tensor(acc_dk.layout, cutlass.Float32)
        acc_dk.fill(0.0)
        acc_dv.fill(0.0)
        coords = rs_thr.partition_C(cute.make_identity_tensor((WGMMA_M, self.head_dim)))
        kv_base = n_tile * KV_TILE + (wg - 1) * WGMMA_M
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        kv_pipe.consumer_wait(kv_state)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        # early_s: the stage whose dV and dK GEMMs are still in flight, released a step late
        held = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        holding = cutlass.Int32(0)
        for g in cutlass.range(self.group, unroll=1):
            h_idx = hkv * self.group + g
            blocks = self.blocks_of(sparse, n_tile, KV_TILE, self.config.sparse_kv_block,
                                     h_idx, b_idx)
            for t in cutlass.range(walk_length(blocks, self.q_steps_per_block), unroll=1):
                m_tile, is_partial = self.tile_of(blocks, t, self.config.sparse_q_block // Q_STEP,
                                                  self.q_steps_per_block)
                q_pipe.consumer_wait(state)
                acc_s = None
                if cutlass.const_expr(self.config.early_s):
                    acc_s = self.issue_s(frags, mma_ss, ss_thr, state.index, wg)
                    warpgroup.wait_group(1)  # the last step's dV and dK are in
                    if holding > 0:
                        q_pipe.consumer_release(held)
                        held.advance()
                    holding = cutlass.Int32(1)
                self.dkdv_step(frags, acc_dk, acc_dv, mma_ss, mma_rs, ss_thr, state.index, wg,
                               is_partial, m_tile * Q_STEP, kv_base, b_idx, h_idx, stats,
                               captures, fused, acc_s)
                if cutlass.const_expr(not self.config.early_s):
                    q_pipe.consumer_release(state)
                state.advance()
        if cutlass.const_expr(self.config.early_s):
            warpgroup.wait_group(0)
            if holding > 0:
                q_pipe.consumer_release(held)
        self.store_rows(acc_dk, coords, mdK, kv_base, self.kv_len, b_idx, hkv,
                        self.config.sm_scale)
        self.store_rows(acc_dv, coords, mdV, kv_base, self.kv_len, b_idx, hkv, 1.0)
        if cutlass.const_expr(fused is not None):
            if self._dq_leader(tidx):
                cute.arch.cp_async_bulk_wait_group(0, read=False)

    @cute.jit
    def issue_s(self, frags, mma_ss, ss_thr, stage, wg):
        """S^T's accumulator, its GEMM issued as a commit group of its own (``early_s``:
        while the last step's dV and dK run; its registers are free once that step's dS^T
        is made, dP^T's are not: they hold dS^T, which dK's GEMM reads)."""
        tSrK, _, tSrQ, _, _, _ = frags
        acc_s = cute.make_rmem_tensor(ss_thr.partition_shape_C((WGMMA_M, Q_STEP)), cutlass.Float32)
        warpgroup.fence()
        self.gemm_ss(mma_ss, acc_s, tSrK, wg - 1, tSrQ, stage)
        warpgroup.commit_group()
        return acc_s

    @cute.jit
    def dkdv_step(self, frags, acc_dk, acc_dv, mma_ss, mma_rs, ss_thr, stage, wg, is_partial,
                  q_base, kv_base, b_idx, h_idx, stats, captures, fused, acc_s=None):
        """One Q tile: S^T and dP^T, P^T and dS^T, dV += P^T dO and dK += dS^T Q. The
        tile's LSE and delta go through the warp's stats rows in shared memory, loaded
        while S^T and dP^T run: in registers (16 of each a thread) they left the
        accumulators too few at head dim 128. ``acc_s``: S^T's, its GEMM already issued
        (``early_s``; the step then ends with dV's and dK's GEMMs in flight), or None."""
        tSrK, tSrV, tSrQ, tSrdO, tKrQt, tVrdOt = frags
        early = acc_s is not None
        if cutlass.const_expr(not early):
            acc_s = cute.make_rmem_tensor(ss_thr.partition_shape_C((WGMMA_M, Q_STEP)),
                                          cutlass.Float32)
        acc_dp = cute.make_rmem_tensor(acc_s.layout, cutlass.Float32)
        cS = ss_thr.partition_C(cute.make_identity_tensor((WGMMA_M, Q_STEP)))
        mLSE, mDelta, s_stats = stats
        lse, delta = (self.thread_stats(s_stats[None, j], cS) for j in range(2))
        rP = cute.make_rmem_tensor(acc_s.layout, self.dtype)
        rdS = cute.make_rmem_tensor(acc_dp.layout, self.dtype)
        edge = (kv_base + WGMMA_M > self.kv_len) | (q_base + Q_STEP > self.q_len)
        warpgroup.fence()
        if cutlass.const_expr(not early):
            self.gemm_ss(mma_ss, acc_s, tSrK, wg - 1, tSrQ, stage)
        if cutlass.const_expr(self.config.pipelined):
            # S^T, then dP^T, in commit groups of their own: P^T while dP^T runs, then
            # dV's GEMM issued and dS^T computed while it runs
            if cutlass.const_expr(not early):
                warpgroup.commit_group()
            self.gemm_ss(mma_ss, acc_dp, tSrV, wg - 1, tSrdO, stage)
            warpgroup.commit_group()
            self.stage_stats(mLSE, mDelta, q_base, b_idx, h_idx, s_stats)
            warpgroup.wait_group(1)  # S^T is in
            self.keep_scores(acc_s, rP, cS, lse, True, is_partial, edge, q_base, kv_base,
                             b_idx, h_idx, captures)
            warpgroup.fence()
            self.gemm_rs(mma_rs, acc_dv, rP, tVrdOt, stage)
            warpgroup.commit_group()
            warpgroup.wait_group(1)  # dP^T is in; dV += P^T dO may still run
        else:
            self.gemm_ss(mma_ss, acc_dp, tSrV, wg - 1, tSrdO, stage)
            warpgroup.commit_group()
            self.stage_stats(mLSE, mDelta, q_base, b_idx, h_idx, s_stats)
            warpgroup.wait_group(0)
            self.keep_scores(acc_s, rP, cS, lse, True, is_partial, edge, q_base, kv_base,
                             b_idx, h_idx, captures)
        self.score_grads(acc_s, acc_dp, cS, lse, delta, True, q_base, kv_base, b_idx, h_idx,
                         captures, True)
        rdS.store(acc_dp.load().to(self.dtype))
        warpgroup.fence()
        if cutlass.const_expr(not self.config.pipelined):
            self.gemm_rs(mma_rs, acc_dv, rP, tVrdOt, stage)
        if cutlass.const_expr(fused is not None):
            self.dq_gemm(fused, rdS, stage, wg)
        self.gemm_rs(mma_rs, acc_dk, rdS, tKrQt, stage)
        warpgroup.commit_group()
        if cutlass.const_expr(fused is not None):
            # dQ's GEMM (and dV's) done, dK's still running: dQ goes out meanwhile
            warpgroup.wait_group(1)
            self.dq_add(fused, wg, q_base, b_idx, h_idx)
        if cutlass.const_expr(not early):
            warpgroup.wait_group(0)

    # ------------------------------------------------------------- fused dQ
    @staticmethod
    def _dq_leader(tidx):
        """Whether this thread's warp issues its warpgroup's dQ reduce-adds (the first)."""
        return (tidx // 32) % (THREADS_PER_WG // 32) == 0

    @cute.jit
    def dq_parts(self, tma_dq, g_dq, mma_dq, mma_ss, fused_smem, sK, tidx):
        """What ``dq_gemm`` and ``dq_add`` need, made once per consumer thread: the dQ
        MMA's fragments (dS tiles as A, K^T as B: this warpgroup's half of the head dim),
        its accumulator, the store of dS^T's registers into a dS tile, the accumulator's
        place in the dQ halves (as one Q_STEP x D tile) and their TMA partitions."""
        sdS, sdQ = fused_smem
        dq_thr = mma_dq.get_slice(tidx - THREADS_PER_WG)  # 0 .. 255, both warpgroups
        acc_dq = cute.make_rmem_tensor(dq_thr.partition_shape_C((Q_STEP, self.head_dim)),
                                       cutlass.Float32)
        store = cute.make_tiled_copy_C(
            cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False,
                                                                  num_matrices=4), self.dtype),
            mma_ss)
        st_thr = store.get_slice(tidx % THREADS_PER_WG)
        dq_smem, dq_gmem = _partition(tma_dq, sdQ, g_dq, Q_STEP, self.head_dim // 2)
        return (tma_dq, mma_dq, acc_dq,
                mma_dq.make_fragment_A(dq_thr.partition_A(sdS)),
                mma_dq.make_fragment_B(dq_thr.partition_B(_transposed(sK))),
                store, st_thr, st_thr.partition_D(_transposed(sdS)),
                dq_thr.partition_C(cute.group_modes(sdQ, 1, 3)), dq_smem, dq_gmem)

    @cute.jit
    def dq_gemm(self, fused, rdS, stage, wg):
        """dQ of one Q step, issued: both warpgroups' dS^T halves into the stage's dS tile,
        then dQ = dS K (each warpgroup its half of the head dim) as a commit group of its
        own. A stage's dS tile is rewritten two steps later, by when both warpgroups have
        passed this step's barrier, so its dQ GEMM (waited for in this step) has read it."""
        (_, mma_dq, acc_dq, frag_ds, frag_kt, store, st_thr, ds_dst, _, _, _) = fused
        tidx, _, _ = cute.arch.thread_idx()
        if self._dq_leader(tidx):
            # the last step's reduce-add has read this warpgroup's dQ half (``dq_add``
            # rewrites it); the barrier below tells the other warps
            cute.arch.cp_async_bulk_wait_group(0, read=True)
        cute.copy(store, st_thr.retile(rdS), ds_dst[(None, None, None, wg - 1 + 2 * stage)])
        # the generic-proxy stores made visible to WGMMA's async proxy, then both halves in
        cute.arch.fence_proxy("async.shared", space="cta")
        pipeline.NamedBarrier(barrier_id=FlexBwdBarrier.DS_WRITTEN,
                              num_threads=2 * THREADS_PER_WG).arrive_and_wait()
        warpgroup.fence()
        for half in cutlass.range_constexpr(2):
            for kb in cutlass.range_constexpr(cute.size(frag_ds, mode=[2])):
                mma_dq.set(warpgroup.Field.ACCUMULATE, half + kb != 0)
                cute.gemm(mma_dq, acc_dq, frag_ds[(None, None, kb, half + 2 * stage)],
                          frag_kt[(None, None, kb, half)], acc_dq)
        warpgroup.commit_group()

    @cute.jit
    def dq_add(self, fused, wg, q_base, b_idx, h_idx):
        """The step's dQ (its GEMM waited for) into the warpgroup's dQ half in shared
        memory, which one TMA reduce-add puts into the accumulator."""
        (tma_dq, _, acc_dq, _, _, _, _, _, dq_dst, dq_smem, dq_gmem) = fused
        tidx, _, _ = cute.arch.thread_idx()
        dq_dst.store(acc_dq.load())
        # visible to the TMA (async proxy), then the whole half written
        cute.arch.fence_proxy("async.shared", space="cta")
        pipeline.NamedBarrier(barrier_id=FlexBwdBarrier.DQ_WRITTEN_WG1 + wg - 1,
                              num_threads=THREADS_PER_WG).arrive_and_wait()
        if self._dq_leader(tidx):
            cute.copy(tma_dq, dq_smem[(None, wg - 1)],
                      dq_gmem[(None, q_base // Q_STEP, wg - 1, h_idx + self.heads * b_idx)])
            cute.arch.cp_async_bulk_commit_group()

    @cute.jit
    def cast_dq(self, accum, mdQ, stream):
        """dQ = accum * sm_scale in the input dtype, one thread per 8 values of a row."""
        rows = cute.size(accum.shape[0]) * cute.size(accum.shape[1]) * self.q_len
        total = rows * (self.head_dim // 8)
        self.kernel_cast(accum, mdQ, total).launch(
            grid=[(total + CAST_THREADS - 1) // CAST_THREADS, 1, 1],
            block=[CAST_THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel_cast(self, accum: cute.Tensor, mdQ: cute.Tensor, total: cutlass.Constexpr):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        i = bidx * CAST_THREADS + tidx
        if i < total:
            chunks = self.head_dim // 8
            row = i // chunks
            col = (i - row * chunks) * 8
            q_idx = row % self.q_len
            h_idx = (row // self.q_len) % self.heads
            b_idx = row // (self.q_len * self.heads)
            crd = (b_idx, h_idx, q_idx, col)
            src = cute.make_tensor(accum.iterator + cute.crd2idx(crd, accum.layout),
                                   cute.make_layout(8))
            dst = cute.make_tensor(mdQ.iterator + cute.crd2idx(crd, mdQ.layout),
                                   cute.make_layout(8))
            dst.store((src.load() * self.config.sm_scale).to(self.dtype))

    # -------------------------------------------------------------- dQ kernel
    @cute.kernel
    def kernel_dq(self, tma_q: cute.CopyAtom, g_q: cute.Tensor, tma_do: cute.CopyAtom,
                  g_do: cute.Tensor, tma_k: cute.CopyAtom, g_k: cute.Tensor,
                  tma_v: cute.CopyAtom, g_v: cute.Tensor, mdQ: cute.Tensor,
                  mLSE: cute.Tensor, mDelta: cute.Tensor, kv_num: cute.Tensor,
                  kv_idx: cute.Tensor, full_kv_num: cute.Tensor, full_kv_idx: cute.Tensor,
                  captures, mma_ss: cute.TiledMma, mma_rs: cute.TiledMma,
                  resident: cute.ComposedLayout, ring: cute.ComposedLayout):
        tidx, _, _ = cute.arch.thread_idx()
        m_tile, h_idx, b_idx = cute.arch.block_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp == 0:
            for atom in (tma_q, tma_do, tma_k, tma_v):
                cpasync.prefetch_descriptor(atom)
        q_pipe, kv_pipe, sQ, sdO, sK, sV, _, _ = self._smem(resident, ring)
        blocks = self.blocks_of((kv_num, kv_idx, full_kv_num, full_kv_idx), m_tile, Q_TILE,
                                 self.config.sparse_q_block, h_idx, b_idx)
        l_idx = h_idx + self.heads * b_idx
        if warp // 4 == 0:
            cute.arch.setmaxregister_decrease(self.producer_regs)
            if warp == 0:
                self.load_resident(q_pipe, tma_q, g_q, tma_do, g_do, sQ, sdO, m_tile, l_idx)
                parts = self.ring_parts(tma_k, sK, g_k, tma_v, sV, g_v)
                state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                                     self.stages)
                for t in cutlass.range(walk_length(blocks, self.kv_steps_per_block),
                                       unroll=1):
                    n_tile, _ = self.tile_of(blocks, t, self.config.sparse_kv_block // KV_STEP,
                                             self.kv_steps_per_block)
                    self.load_ring(kv_pipe, state, parts, n_tile, l_idx)
                    state.advance()
                kv_pipe.producer_tail(state)
        else:
            cute.arch.setmaxregister_increase(self.consumer_regs)
            self.consumer_dq(q_pipe, kv_pipe, (sQ, sdO, sK, sV), mma_ss, mma_rs, tidx, m_tile,
                             h_idx, b_idx, blocks, mdQ, mLSE, mDelta, captures)

    @cute.jit
    def consumer_dq(self, q_pipe, kv_pipe, tiles, mma_ss, mma_rs, tidx, m_tile, h_idx, b_idx,
                    blocks, mdQ, mLSE, mDelta, captures):
        sQ, sdO, sK, sV = tiles
        wg = tidx // THREADS_PER_WG
        ss_thr = mma_ss.get_slice(tidx % THREADS_PER_WG)
        rs_thr = mma_rs.get_slice(tidx % THREADS_PER_WG)
        tSrQ = mma_ss.make_fragment_A(ss_thr.partition_A(sQ))
        tSrdO = mma_ss.make_fragment_A(ss_thr.partition_A(sdO))
        tSrK = mma_ss.make_fragment_B(ss_thr.partition_B(sK))
        tSrV = mma_ss.make_fragment_B(ss_thr.partition_B(sV))
        tQrKt = mma_rs.make_fragment_B(rs_thr.partition_B(_transposed(sK)))
        acc_dq = cute.make_rmem_tensor(rs_thr.partition_shape_C((WGMMA_M, self.head_dim)),
                                       cutlass.Float32)
        acc_dq.fill(0.0)
        coords = rs_thr.partition_C(cute.make_identity_tensor((WGMMA_M, self.head_dim)))
        acc_s = cute.make_rmem_tensor(ss_thr.partition_shape_C((WGMMA_M, KV_STEP)), cutlass.Float32)
        acc_dp = cute.make_rmem_tensor(acc_s.layout, cutlass.Float32)
        cS = ss_thr.partition_C(cute.make_identity_tensor((WGMMA_M, KV_STEP)))
        q_base = m_tile * Q_TILE + (wg - 1) * WGMMA_M
        lse = cute.make_rmem_tensor(cute.make_layout(2), cutlass.Float32)
        delta = cute.make_rmem_tensor(cute.make_layout(2), cutlass.Float32)
        self.load_stats(mLSE, mDelta, cS, q_base, b_idx, h_idx, lse, delta)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        q_pipe.consumer_wait(q_state)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        for t in cutlass.range(walk_length(blocks, self.kv_steps_per_block), unroll=1):
            n_tile, is_partial = self.tile_of(blocks, t, self.config.sparse_kv_block // KV_STEP,
                                              self.kv_steps_per_block)
            kv_pipe.consumer_wait(state)
            warpgroup.fence()
            self.gemm_ss(mma_ss, acc_s, tSrQ, wg - 1, tSrK, state.index)
            self.gemm_ss(mma_ss, acc_dp, tSrdO, wg - 1, tSrV, state.index)
            warpgroup.commit_group()
            warpgroup.wait_group(0)
            kv_base = n_tile * KV_STEP
            edge = (q_base + WGMMA_M > self.q_len) | (kv_base + KV_STEP > self.kv_len)
            self.keep_scores(acc_s, None, cS, lse, False, is_partial, edge, q_base, kv_base,
                             b_idx, h_idx, captures)
            self.score_grads(acc_s, acc_dp, cS, lse, delta, False, q_base, kv_base, b_idx,
                             h_idx, captures, False)
            rdS = cute.make_rmem_tensor(acc_dp.layout, self.dtype)
            rdS.store(acc_dp.load().to(self.dtype))
            warpgroup.fence()
            self.gemm_rs(mma_rs, acc_dq, rdS, tQrKt, state.index)
            warpgroup.commit_group()
            warpgroup.wait_group(0)
            kv_pipe.consumer_release(state)
            state.advance()
        self.store_rows(acc_dq, coords, mdQ, q_base, self.q_len, b_idx, h_idx,
                        self.config.sm_scale)
