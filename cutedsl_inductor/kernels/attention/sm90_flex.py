"""FlexAttention forward for Hopper (sm_90a) in CuTe DSL: TMA loads, WGMMA, a producer
warp and two consumer warpgroups, online softmax overlapped with the GEMMs, flex's block
sparsity.

One CTA = one 128-row Q tile of one (batch, head): 3 warpgroups. Warp 0 (warpgroup 0;
24 registers a thread, the consumers 240: ``setmaxnreg``) loads Q once (two 64-row
halves) and then, for every KV tile the BlockMask lists, K's tile into one
``stages``-deep smem ring and V's into another (``PipelineTmaAsync`` each: one mbarrier
pair per stage; the rings advance together, so a tile's K and V share a slot index).
Consumer warpgroup w (1, 2) owns Q rows ``64 (w - 1) ..`` of the tile: per KV tile S =
Q K^T (WGMMA from smem), then per accumulator element ``score_mod`` on ``S * sm_scale``
and, in partial blocks only, ``mask_mod`` (-inf where it is False); elements past
KV_LEN are -inf (the mask and bounds work is skipped in a full block's tile within
KV_LEN). The row max and sum are fp32 in log2 units: p = exp2(s log2e - m), one FFMA and
one ex2; the max and sum over a thread's values are trees, the max across the row's 4
threads shuffles, the sums stay per thread until the end. ``FlexConfig.fold_scale`` (knob
``flex_fold_scale``; the template sets it for the identity score_mod and sm_scale > 0):
no multiply by sm_scale per element, the row max is taken over the raw scores and p =
exp2(s c - m) with c = sm_scale log2e (one FFMA, no FMUL). P is converted to the input
dtype in registers and O += P V by WGMMA with A from registers. The end: O / l stored
(rows past Q_LEN dropped), LSE = m + log2(l) and the row max, both in log2 units as
Inductor's flex kernel stores them (the HOP's caller scales them by ln 2); a row that
no key reaches gets O = 0, LSE = -inf, max = -inf (as Triton's).

The mainloop (``FlexConfig.pipelined``; False: the serial loop, S, softmax, P V, each
GEMM waited for at once): tile 0's S alone, then per tile t the WGMMAs S_t = Q K_t^T and
O += P_{t-1} V_{t-1} are issued back to back as two commit groups; ``wait_group(1)``
(S_t is in, K_t's slot released) lets the mask and softmax of S_t run while the P V GEMM
is still on the tensor cores; ``wait_group(0)`` then releases V_{t-1}'s slot, and only
after it are O rescaled and P_t written (both are that GEMM's registers); the last P V
after the loop. Invariants: no register an in-flight WGMMA reads or writes is touched
before its wait; a slot is released only after the GEMM reading it is waited for; a
WGMMA's ACCUMULATE field is set in the body of the loop or branch it is issued in (a
TiledMma set only inside a helper is not carried out of the caller's region). ptxas
hoists a wgmma wait to the top of the basic block it sits in, so ``scores_step`` traces
the softmax into both arms of its mask branch: the join, and with it the wait, come
after the exp2s (``tests/kernels/attention/test_sm90_flex.py`` checks the PTX order).
With ``FlexConfig.pingpong`` (knob ``flex_pingpong``, on by default) the two warpgroups
take turns issuing their GEMMs (``FlexBarrier``'s turns), so that one's softmax runs while
the other's GEMMs do; without it their GEMMs and softmaxes interleave as the warp
schedulers take them.

Persistent (``FlexConfig.persistent``, knob ``flex_persistent``): about one CTA per SM
(``sm90.SMS``; ``parts.persistent_grid``) and CTA c walks steps c, c + gridDim.x, ... in
``parts.persistent_tile``'s order (a (batch, head)'s last Q tiles first, odd rounds
backwards), so a CTA's fixed costs (Q's load, the first K tile's latency, the lone first
S GEMM, the last P V, O's normalization and store) overlap its neighbours' work. Q has
two buffers (a ``q_stages`` ring: full/empty mbarrier pairs, phases flipping per tile):
the consumers release a tile's Q buffer once its last S GEMM is waited for, so the
producer loads the next tiles' Q, K and V while this tile's last P V, normalization and
store run. The K/V rings' states, like Q's, carry over from tile to tile (the tile
helpers return them: an advance inside a helper is not carried out of the caller's
loop). Per tile the consumers zero O and reset the row max and sum. The ping-pong turns
go on across tiles: warpgroup 2 arrives once before the walk, every turn is passed on,
and warpgroup 1 takes 2's last pass after the walk.

Block sparsity, as flex's Triton kernel reads it: the Q block ``m * 128 //
sparse_q_block`` of batch ``b % SPARSE_B``, head ``h % SPARSE_H`` lists
``kv_num_blocks`` partial blocks (``kv_indices``), then ``full_kv_num_blocks`` full
ones (``full_kv_indices``); each block is ``sparse_kv_block // block_n`` KV tiles, of
which those before KV_LEN's last tile are walked (as Triton caps its walk). Producer
and consumers walk the same list; blocks not listed are never loaded.

Hooks (the template overrides them with the rendered subgraphs): ``score_mod(score, b,
h, q_idx, kv_idx, in_bounds, captures)`` -> Float32 and ``mask_mod(b, h, q_idx, kv_idx,
in_bounds, captures)`` -> Boolean; ``in_bounds`` is False for elements outside
(Q_LEN, KV_LEN), whose values are dropped. The hooks see in-range indices only (an index
past its length is given as 0), so a captured tensor's read needs no per-element guard:
a read that depends on the query (the key) alone is one load per row (column), not one
per element.

Layouts: Q, K, V, O are torch's (B, H, S, D) with unit stride in D (TMA: 16-byte
aligned other strides); GQA reads K/V head ``h // (H // H_kv)`` (a 0-stride mode), a
K/V batch of 1 broadcasts. LSE and max are (B, H, Q_LEN) fp32.

Failure semantics: a ``FlexConfig`` that cannot run raises ``ValueError`` at
construction; operand dtypes or strides the kernel cannot take raise ``ValueError``
while tracing, before any MLIR is emitted (the choice is then dropped). On the device,
a producer and consumers walking different lists, or a ring released twice or never,
hangs the CTA (mbarrier waits do not time out).
"""

import operator
from typing import NamedTuple

# No ``from __future__ import annotations``: ``cute.struct`` reads annotations as types.
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.memory import SmemAllocator
from cutlass.tensor_utils import LayoutEnum

from ..sm90 import SMS, THREADS_PER_WG, WGMMA_M, FlexBarrier
from .config import BLOCK_M, FlexConfig
from .parts import (
    LOG2E,
    as_a_operand,
    block_list,
    in_range,
    persistent_grid,
    persistent_tile,
    rows_cols,
    tree_reduce,
    walk_length,
    walk_tile,
)

__all__ = ["Sm90FlexAttention"]


class Registers(NamedTuple):
    """A consumer thread's operand views and accumulators, made once, reused by every tile."""
    cS: cute.Tensor  # (row, column) of each S value
    tSrQ: cute.Tensor  # Q's two halves per Q buffer (shared memory)
    tSrK: cute.Tensor
    tOrV: cute.Tensor
    acc_s: cute.Tensor
    acc_o: cute.Tensor
    rP: cute.Tensor  # P in the input dtype
    tOrP: cute.Tensor  # rP as the A operand of O += P V
    row_max: cute.Tensor  # log2 units
    row_sum: cute.Tensor  # this thread's partial sums
    correction: cute.Tensor  # O's row factors of the last softmax step


class Sm90FlexAttention:
    """``Sm90FlexAttention(config)(q, k, v, o, lse, max, kv_num_blocks, kv_indices,
    full_kv_num_blocks, full_kv_indices, captures, stream)``; see the module docstring."""

    def __init__(self, config: FlexConfig):
        self.config = config
        self.head_dim = config.head_dim
        self.block_n = config.block_n
        self.stages = config.stages
        self.num_threads = 3 * THREADS_PER_WG
        self.producer_regs = 24
        self.consumer_regs = 240

    # -------------------------------------------------------------- the hooks
    @cute.jit
    def score_mod(self, score, b_idx, h_idx, q_idx, kv_idx, in_bounds, captures):
        return score

    @cute.jit
    def mask_mod(self, b_idx, h_idx, q_idx, kv_idx, in_bounds, captures):
        return cutlass.Boolean(True)

    # ------------------------------------------------------------- host entry
    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor,
                 mLSE: cute.Tensor, mMax: cute.Tensor, kv_num: cute.Tensor,
                 kv_idx: cute.Tensor, full_num: cute.Tensor, full_idx: cute.Tensor,
                 captures, stream):
        dtype = mQ.element_type
        if cutlass.const_expr(dtype not in (cutlass.BFloat16, cutlass.Float16)
                              or mK.element_type != dtype or mV.element_type != dtype):
            raise ValueError("Sm90FlexAttention: Q, K, V must be one of bf16/fp16")
        self.dtype = dtype
        batch, heads, q_len, d = mQ.shape
        kv_batch, kv_heads, kv_len, _ = mK.shape
        if cutlass.const_expr(d != self.head_dim or mV.shape[3] != self.head_dim):
            raise ValueError(f"Sm90FlexAttention: head dims must be {self.head_dim}")
        group = heads // kv_heads
        kb_stride = 0 if cutlass.const_expr(kv_batch == 1) else mK.stride[0]
        vb_stride = 0 if cutlass.const_expr(kv_batch == 1) else mV.stride[0]
        # (S, D, (H, B)) / K: (S, D, ((G, H_kv), B)) / V: (D, S, ((G, H_kv), B))
        q = cute.make_tensor(mQ.iterator, cute.make_layout(
            (q_len, d, (heads, batch)), stride=(mQ.stride[2], 1, (mQ.stride[1], mQ.stride[0]))))
        k = cute.make_tensor(mK.iterator, cute.make_layout(
            (kv_len, d, ((group, kv_heads), batch)),
            stride=(mK.stride[2], 1, ((0, mK.stride[1]), kb_stride))))
        v = cute.make_tensor(mV.iterator, cute.make_layout(
            (d, kv_len, ((group, kv_heads), batch)),
            stride=(1, mV.stride[2], ((0, mV.stride[1]), vb_stride))))

        bn = self.block_n
        self.qk_mma = sm90_utils.make_trivial_tiled_mma(
            dtype, dtype, LayoutEnum.from_tensor(q).sm90_mma_major_mode(),
            LayoutEnum.from_tensor(k).sm90_mma_major_mode(), cutlass.Float32, (1, 1, 1),
            (WGMMA_M, bn))
        self.pv_mma = sm90_utils.make_trivial_tiled_mma(
            dtype, dtype, cute.nvgpu.OperandMajorMode.K,
            LayoutEnum.from_tensor(v).sm90_mma_major_mode(), cutlass.Float32, (1, 1, 1),
            (WGMMA_M, d), warpgroup.OperandSource.RMEM)
        qk_tile = (WGMMA_M, bn, d)
        pv_tile = (WGMMA_M, d, bn)
        sQ_layout = sm90_utils.make_smem_layout_a(LayoutEnum.from_tensor(q), qk_tile, dtype,
                                                  2 * self.config.q_stages)
        sK_layout = sm90_utils.make_smem_layout_b(LayoutEnum.from_tensor(k), qk_tile, dtype,
                                                  self.stages)
        sV_layout = sm90_utils.make_smem_layout_b(LayoutEnum.from_tensor(v), pv_tile, dtype,
                                                  self.stages)
        load = cpasync.CopyBulkTensorTileG2SOp()
        tma_q, tQ = cpasync.make_tiled_tma_atom(
            load, q, cute.slice_(sQ_layout, (None, None, 0)), (WGMMA_M, d))
        tma_k, tK = cpasync.make_tiled_tma_atom(
            load, k, cute.slice_(sK_layout, (None, None, 0)), (bn, d))
        tma_v, tV = cpasync.make_tiled_tma_atom(
            load, v, cute.slice_(sV_layout, (None, None, 0)), (d, bn))
        self.q_bytes = 2 * cute.size_in_bytes(dtype, cute.slice_(sQ_layout, (None, None, 0)))
        self.k_bytes = cute.size_in_bytes(dtype, cute.slice_(sK_layout, (None, None, 0)))
        self.v_bytes = cute.size_in_bytes(dtype, cute.slice_(sV_layout, (None, None, 0)))
        stages, q_stages = self.stages, self.config.q_stages

        @cute.struct
        class FlexSmem:
            q_bars: cute.struct.MemRange[cutlass.Int64, q_stages * 2]
            k_bars: cute.struct.MemRange[cutlass.Int64, stages * 2]
            v_bars: cute.struct.MemRange[cutlass.Int64, stages * 2]
            sQ: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(sV_layout)], 1024]

        self.smem_struct = FlexSmem
        # KV tiles walked per listed block: a block reaching past KV_LEN (flex's
        # "no mask" BlockMask is one block of 2**30) stops at the last tile of KV_LEN
        self.steps_per_block = min(self.config.kv_tiles_per_block, (kv_len + bn - 1) // bn)
        q_tiles = (q_len + BLOCK_M - 1) // BLOCK_M
        grid = [q_tiles, heads, batch]
        tiles = q_tiles * heads * batch
        if cutlass.const_expr(self.config.persistent):
            grid = [persistent_grid(q_tiles, tiles, SMS), 1, 1]
        self.kernel(
            tma_q, tQ, tma_k, tK, tma_v, tV, mO, mLSE, mMax, kv_num, kv_idx, full_num,
            full_idx, captures, self.qk_mma, self.pv_mma, sQ_layout, sK_layout, sV_layout,
            q_len, kv_len, heads, q_tiles, tiles,
        ).launch(grid=grid, block=[self.num_threads, 1, 1], min_blocks_per_mp=1,
                 stream=stream)

    # ---------------------------------------------------------------- kernel
    @cute.kernel
    def kernel(self, tma_q: cute.CopyAtom, tQ: cute.Tensor, tma_k: cute.CopyAtom,
               tK: cute.Tensor, tma_v: cute.CopyAtom, tV: cute.Tensor, mO: cute.Tensor,
               mLSE: cute.Tensor, mMax: cute.Tensor, kv_num: cute.Tensor, kv_idx: cute.Tensor,
               full_num: cute.Tensor, full_idx: cute.Tensor, captures,
               qk_mma: cute.TiledMma, pv_mma: cute.TiledMma, sQ_layout: cute.ComposedLayout,
               sK_layout: cute.ComposedLayout, sV_layout: cute.ComposedLayout,
               q_len: cutlass.Int32, kv_len: cutlass.Int32, heads: cutlass.Int32,
               q_tiles: cutlass.Int32, tiles: cutlass.Int32):
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = warp // 4
        if warp == 0:
            cpasync.prefetch_descriptor(tma_q)
            cpasync.prefetch_descriptor(tma_k)
            cpasync.prefetch_descriptor(tma_v)
        smem = SmemAllocator().allocate(self.smem_struct)
        pipes = (self._pipeline(smem.q_bars.data_ptr(), self.config.q_stages, self.q_bytes),
                 self._pipeline(smem.k_bars.data_ptr(), self.stages, self.k_bytes),
                 self._pipeline(smem.v_bars.data_ptr(), self.stages, self.v_bytes))
        sQ = smem.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = smem.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = smem.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        lists = (kv_num, kv_idx, full_num, full_idx)
        walk = (q_tiles, heads, tiles)
        if wg == 0:
            cute.arch.setmaxregister_decrease(self.producer_regs)
            if warp == 0:
                self.producer(pipes, tma_q, tQ, tma_k, tK, tma_v, tV, sQ, sK, sV, lists, walk)
        else:
            cute.arch.setmaxregister_increase(self.consumer_regs)
            self.consumer(pipes, sQ, sK, sV, qk_mma, pv_mma, lists, walk, tidx, wg, mO, mLSE,
                          mMax, captures, q_len, kv_len)

    def _pipeline(self, bars, stages, tx_bytes):
        return pipeline.PipelineTmaAsync.create(
            barrier_storage=bars, num_stages=stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread,
                                                     2 * THREADS_PER_WG),
            tx_count=tx_bytes, cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)),
            enable_multicast_signaling=True)

    @cute.jit
    def kv_tile_of(self, blocks, t):
        """The KV tile index of step ``t`` of the walk, and whether its block is partial."""
        return walk_tile(blocks, self.config.has_full_blocks, t, self.config.kv_tiles_per_block,
                         self.steps_per_block)

    @cute.jit
    def blocks_of(self, lists, m_block, h_idx, b_idx):
        """The BlockMask walk's state for Q tile ``m_block`` of (``b_idx``, ``h_idx``)."""
        return block_list(lists, self.config.has_full_blocks, m_block, BLOCK_M,
                          self.config.sparse_q_block, h_idx, b_idx)

    # -------------------------------------------------------------- producer
    @cute.jit
    def producer(self, pipes, tma_q, tQ, tma_k, tK, tma_v, tV, sQ, sK, sV, lists, walk):
        d, bn = self.head_dim, self.block_n
        tQsQ, tQgQ = cpasync.tma_partition(
            tma_q, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 2),
            cute.group_modes(cute.local_tile(tQ, (WGMMA_M, d), (None, None, None)), 0, 2))
        tKsK, tKgK = cpasync.tma_partition(
            tma_k, 0, cute.make_layout(1), cute.group_modes(sK, 0, 2),
            cute.group_modes(cute.local_tile(tK, (bn, d), (None, None, None)), 0, 2))
        tVsV, tVgV = cpasync.tma_partition(
            tma_v, 0, cute.make_layout(1), cute.group_modes(sV, 0, 2),
            cute.group_modes(cute.local_tile(tV, (d, bn), (None, None, None)), 0, 2))
        copies = ((tma_q, tQsQ, tQgQ), (tma_k, tKsK, tKgK), (tma_v, tVsV, tVgV))
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                               self.config.q_stages)
        # K and V of one tile share a ring index (the rings advance together)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        if cutlass.const_expr(self.config.persistent):
            q_tiles, heads, tiles = walk
            for step in cutlass.range(cute.arch.block_idx()[0], tiles, cute.arch.grid_dim()[0],
                                      unroll=1):
                m_block, h_idx, b_idx = persistent_tile(step, q_tiles, heads, tiles,
                                                        cute.arch.grid_dim()[0])
                q_state, state = self.produce_tile(pipes, copies, lists, m_block, h_idx, b_idx,
                                                   heads, q_state, state)
        else:
            m_block, h_idx, b_idx = cute.arch.block_idx()
            q_state, state = self.produce_tile(pipes, copies, lists, m_block, h_idx, b_idx,
                                               walk[1], q_state, state)
        _, k_pipe, v_pipe = pipes
        k_pipe.producer_tail(state.clone())  # producer_tail advances the state it is given
        v_pipe.producer_tail(state)

    @cute.jit
    def produce_tile(self, pipes, copies, lists, m_block, h_idx, b_idx, heads, q_state, state):
        """One Q tile's loads: Q once its buffer is free, then the listed K and V tiles;
        returns the advanced (Q, K/V) pipeline states (a helper's advances are not carried
        out of the caller's loop otherwise)."""
        q_pipe, k_pipe, v_pipe = pipes
        (tma_q, tQsQ, tQgQ), (tma_k, tKsK, tKgK), (tma_v, tVsV, tVgV) = copies
        l_idx = h_idx + heads * b_idx
        blocks = self.blocks_of(lists, m_block, h_idx, b_idx)
        q_pipe.producer_acquire(q_state)
        for half in cutlass.range_constexpr(2):
            slot = half
            if cutlass.const_expr(self.config.persistent):
                slot = 2 * q_state.index + half
            cute.copy(tma_q, tQgQ[(None, 2 * m_block + half, 0, l_idx)], tQsQ[(None, slot)],
                      tma_bar_ptr=q_pipe.producer_get_barrier(q_state))
        q_pipe.producer_commit(q_state)
        q_state.advance()
        total = walk_length(blocks, self.steps_per_block)
        for t in cutlass.range(total, unroll=1):
            n_tile, _ = self.kv_tile_of(blocks, t)
            k_pipe.producer_acquire(state)
            cute.copy(tma_k, tKgK[(None, n_tile, 0, l_idx)], tKsK[(None, state.index)],
                      tma_bar_ptr=k_pipe.producer_get_barrier(state))
            k_pipe.producer_commit(state)
            v_pipe.producer_acquire(state)
            cute.copy(tma_v, tVgV[(None, 0, n_tile, l_idx)], tVsV[(None, state.index)],
                      tma_bar_ptr=v_pipe.producer_get_barrier(state))
            v_pipe.producer_commit(state)
            state.advance()
        return q_state, state

    # -------------------------------------------------------------- consumer
    @cute.jit
    def consumer(self, pipes, sQ, sK, sV, qk_mma, pv_mma, lists, walk, tidx, wg, mO, mLSE,
                 mMax, captures, q_len, kv_len):
        """The registers every tile reuses, then the tile (persistent: the CTA's walk)."""
        d, bn = self.head_dim, self.block_n
        ctid = tidx % THREADS_PER_WG
        qk_thr = qk_mma.get_slice(ctid)
        pv_thr = pv_mma.get_slice(ctid)
        tSrK = qk_mma.make_fragment_B(qk_thr.partition_B(sK))
        acc_s = cute.make_rmem_tensor(qk_thr.partition_shape_C((WGMMA_M, bn)), cutlass.Float32)
        acc_o = cute.make_rmem_tensor(pv_thr.partition_shape_C((WGMMA_M, d)), cutlass.Float32)
        # P of the last tile softmaxed, in the input dtype: the A operand of O += P V
        rP = cute.make_rmem_tensor(acc_s.layout, self.dtype)
        softmax = tuple(cute.make_rmem_tensor(cute.make_layout(2), cutlass.Float32)
                        for _ in range(3))  # row max, row sum, correction
        regs = Registers(qk_thr.partition_C(cute.make_identity_tensor((WGMMA_M, bn))),
                         qk_mma.make_fragment_A(qk_thr.partition_A(sQ)), tSrK,
                         pv_mma.make_fragment_B(pv_thr.partition_B(sV)), acc_s, acc_o, rP,
                         cute.make_tensor(rP.iterator, as_a_operand(acc_s.layout, bn)),
                         *softmax)
        states = tuple(pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, n)
                       for n in (self.config.q_stages, self.stages, self.stages))
        q_state, k_state, v_state = states
        out = (pv_thr, mO, mLSE, mMax, captures, q_len, kv_len)
        if cutlass.const_expr(self.config.persistent):
            q_tiles, heads, tiles = walk
            self.first_turn(wg)  # the turns go on across the tiles
            for step in cutlass.range(cute.arch.block_idx()[0], tiles, cute.arch.grid_dim()[0],
                                      unroll=1):
                m_block, h_idx, b_idx = persistent_tile(step, q_tiles, heads, tiles,
                                                        cute.arch.grid_dim()[0])
                q_state, k_state, v_state = self.consume_tile(
                    pipes, (q_state, k_state, v_state), qk_mma, pv_mma, regs, lists, wg,
                    m_block, h_idx, b_idx, out)
            if cutlass.const_expr(self.config.pingpong):
                if wg == 1:
                    self.wait_turn(wg)  # 2's pass after the CTA's last turn
        else:
            m_block, h_idx, b_idx = cute.arch.block_idx()
            self.consume_tile(pipes, states, qk_mma, pv_mma, regs, lists, wg, m_block, h_idx,
                              b_idx, out)

    @cute.jit
    def consume_tile(self, pipes, states, qk_mma, pv_mma, regs, lists, wg, m_block, h_idx,
                     b_idx, out):
        """One Q tile: O, the row max and sum from zero, the mainloop, O / l stored.
        Persistent, Q's buffer is released once the tile's last S GEMM is waited for.
        Returns the advanced (Q, K, V) pipeline states."""
        q_pipe = pipes[0]
        q_state, k_state, v_state = states
        pv_thr, mO, mLSE, mMax, captures, q_len, kv_len = out
        regs.acc_o.fill(0.0)
        pv_mma.set(warpgroup.Field.ACCUMULATE, True)
        for r in cutlass.range_constexpr(2):
            regs.row_max[r] = -cutlass.Float32.inf
            regs.row_sum[r] = 0.0
        q_base = m_block * BLOCK_M + (wg - 1) * WGMMA_M
        blocks = self.blocks_of(lists, m_block, h_idx, b_idx)
        q_slot = 0  # Q's first 64-row half in shared memory
        if cutlass.const_expr(self.config.persistent):
            q_slot = 2 * q_state.index
        q_pipe.consumer_wait(q_state)
        tile_args = (regs.cS, q_base, h_idx, b_idx, q_len, kv_len, captures)
        mainloop = self.pipelined_tiles if self.config.pipelined else self.serial_tiles
        k_state, v_state = mainloop(pipes, q_state, k_state, v_state, qk_mma, pv_mma, regs,
                                    blocks, wg, q_slot, tile_args)
        q_state.advance()
        self.finish(regs.acc_o, regs.row_max, regs.row_sum, pv_thr, q_base, h_idx, b_idx, mO,
                    mLSE, mMax, q_len)
        return q_state, k_state, v_state

    @cute.jit
    def release_q(self, q_pipe, q_state):
        """Persistent: the tile's last S GEMM is waited for, Q's buffer may be refilled."""
        if cutlass.const_expr(self.config.persistent):
            q_pipe.consumer_release(q_state)

    @cute.jit
    def pipelined_tiles(self, pipes, q_state, k_state, v_state, qk_mma, pv_mma, regs, blocks,
                        wg, q_slot, tile_args):
        """Tile 0's S alone; then per KV tile t: S_t and O += P_{t-1} V_{t-1} issued
        together, S_t waited for (wait_group 1) and softmaxed while the P V GEMM runs; the
        last P V. Returns the advanced K and V states."""
        q_pipe, k_pipe, v_pipe = pipes
        bn = self.block_n
        acc_s, acc_o, rP = regs.acc_s, regs.acc_o, regs.rP
        softmax = (regs.row_max, regs.row_sum, regs.correction)
        total = walk_length(blocks, self.steps_per_block)
        if total > 0:
            if cutlass.const_expr(not self.config.persistent):
                self.first_turn(wg)
            n_tile, is_partial = self.kv_tile_of(blocks, 0)
            k_pipe.consumer_wait(k_state)
            self.wait_turn(wg)
            warpgroup.fence()
            qk_mma.set(warpgroup.Field.ACCUMULATE, False)  # S from zero
            self.issue_qk(qk_mma, acc_s, regs.tSrQ, regs.tSrK, wg, q_slot, k_state.index)
            self.pass_turn(wg)
            warpgroup.wait_group(0)
            k_pipe.consumer_release(k_state)
            k_state.advance()
            self.scores_step(acc_s, is_partial, n_tile * bn, tile_args,
                             *softmax)  # O is 0: nothing to rescale
            rP.store(acc_s.load().to(self.dtype))
        for t in cutlass.range(1, total, unroll=1):
            n_tile, is_partial = self.kv_tile_of(blocks, t)
            k_pipe.consumer_wait(k_state)
            self.wait_turn(wg)
            warpgroup.fence()
            qk_mma.set(warpgroup.Field.ACCUMULATE, False)  # S from zero
            self.issue_qk(qk_mma, acc_s, regs.tSrQ, regs.tSrK, wg, q_slot, k_state.index)
            v_pipe.consumer_wait(v_state)
            warpgroup.fence()  # (else ptxas adds one: the wait's spin loop ends its view)
            self.issue_pv(pv_mma, acc_o, regs.tOrP, regs.tOrV, v_state.index)
            self.pass_turn(wg)
            warpgroup.wait_group(1)  # S_t is in; P_{t-1} V_{t-1} may still run
            k_pipe.consumer_release(k_state)
            k_state.advance()
            self.scores_step(acc_s, is_partial, n_tile * bn, tile_args, *softmax)
            warpgroup.wait_group(0)  # before O and P's registers are written
            v_pipe.consumer_release(v_state)
            v_state.advance()
            self.rescale(acc_o, regs.correction)
            rP.store(acc_s.load().to(self.dtype))
        self.release_q(q_pipe, q_state)
        if total > 0:
            v_pipe.consumer_wait(v_state)
            self.wait_turn(wg)
            warpgroup.fence()
            self.issue_pv(pv_mma, acc_o, regs.tOrP, regs.tOrV, v_state.index)
            self.pass_turn(wg, not self.config.persistent)
            warpgroup.wait_group(0)
            v_pipe.consumer_release(v_state)
            v_state.advance()
        return k_state, v_state

    @cute.jit
    def serial_tiles(self, pipes, q_state, k_state, v_state, qk_mma, pv_mma, regs, blocks, wg,
                     q_slot, tile_args):
        """Per KV tile: S, softmax, P V, each GEMM waited for at once. Returns the advanced
        K and V states."""
        q_pipe, k_pipe, v_pipe = pipes
        acc_s, acc_o, rP = regs.acc_s, regs.acc_o, regs.rP
        softmax = (regs.row_max, regs.row_sum, regs.correction)
        total = walk_length(blocks, self.steps_per_block)
        for t in cutlass.range(total, unroll=1):
            n_tile, is_partial = self.kv_tile_of(blocks, t)
            k_pipe.consumer_wait(k_state)
            warpgroup.fence()
            qk_mma.set(warpgroup.Field.ACCUMULATE, False)  # S from zero
            self.issue_qk(qk_mma, acc_s, regs.tSrQ, regs.tSrK, wg, q_slot, k_state.index)
            warpgroup.wait_group(0)
            k_pipe.consumer_release(k_state)
            k_state.advance()
            self.scores_step(acc_s, is_partial, n_tile * self.block_n, tile_args, *softmax)
            self.rescale(acc_o, regs.correction)
            rP.store(acc_s.load().to(self.dtype))
            v_pipe.consumer_wait(v_state)
            warpgroup.fence()
            self.issue_pv(pv_mma, acc_o, regs.tOrP, regs.tOrV, v_state.index)
            warpgroup.wait_group(0)
            v_pipe.consumer_release(v_state)
            v_state.advance()
        self.release_q(q_pipe, q_state)
        return k_state, v_state

    # ----------------------------------------------------- ping-pong turns
    # With ``config.pingpong`` the consumer warpgroups take turns issuing their GEMMs, so
    # that one's softmax runs while the other's GEMMs do. Warpgroup w waits for its turn
    # on its turn barrier (bar.sync of its 128 threads) until the other has arrived there
    # (bar.arrive of its 128) after issuing. Warpgroup 1 goes first (2 arrives once
    # before its first turn) and 2 takes the last turn without passing it on, so every
    # arrive has one wait: per warpgroup, its tiles + 1 turns (tile 0's S, each S with
    # the previous P V, the last P V).
    @cute.jit
    def first_turn(self, wg):
        if cutlass.const_expr(self.config.pingpong):
            if wg == 2:
                self.pass_turn(wg)

    @cute.jit
    def wait_turn(self, wg):
        if cutlass.const_expr(self.config.pingpong):
            pipeline.NamedBarrier(barrier_id=FlexBarrier.TURN_WG1 + wg - 1,
                                  num_threads=2 * THREADS_PER_WG).arrive_and_wait()

    @cute.jit
    def pass_turn(self, wg, last: cutlass.Constexpr = False):
        """Hand the turn to the other warpgroup (after the ``last`` turn: 1 only)."""
        if cutlass.const_expr(self.config.pingpong):
            if wg == 1 or not last:
                pipeline.NamedBarrier(barrier_id=FlexBarrier.TURN_WG2 + 1 - wg,
                                      num_threads=2 * THREADS_PER_WG).arrive()

    @cute.jit
    def issue_qk(self, qk_mma, acc_s, tSrQ, tSrK, wg, q_slot, stage):
        """S (+)= Q K^T of warpgroup ``wg``'s rows of the Q tile at half ``q_slot`` and K's
        ring slot ``stage``, committed as
        one WGMMA group (not waited for). The caller clears ACCUMULATE in its own body: a
        TiledMma set only inside a helper is not carried out of the caller's loop or branch."""
        for kb in cutlass.range_constexpr(cute.size(tSrQ, mode=[2])):
            cute.gemm(qk_mma, acc_s, tSrQ[(None, None, kb, q_slot + wg - 1)],
                      tSrK[(None, None, kb, stage)], acc_s)
            qk_mma.set(warpgroup.Field.ACCUMULATE, True)
        warpgroup.commit_group()

    @cute.jit
    def issue_pv(self, pv_mma, acc_o, tOrP, tOrV, stage):
        """O += P V with P from registers and V's ring slot ``stage`` (ACCUMULATE set once,
        before the mainloop), committed as one WGMMA group (not waited for: P's and O's
        registers stay untouched until it is)."""
        for kb in cutlass.range_constexpr(self.block_n // 16):
            cute.gemm(pv_mma, acc_o, tOrP[(None, None, kb)], tOrV[(None, None, kb, stage)],
                      acc_o)
        warpgroup.commit_group()

    @cute.jit
    def scores_step(self, acc_s, is_partial, kv_base, tile_args, row_max, row_sum,
                    correction):
        """``modify_scores`` then ``softmax_step`` on S (``correction`` <- O's row factors).
        The mask and bounds work only in a partial block or a tile reaching past KV_LEN.
        The softmax is traced into both branches: ptxas hoists a wgmma wait to the top of
        the block it sits in, so the ``wait_group(0)`` after this stays after the exp2s
        only where no join point precedes it."""
        kv_len = tile_args[5]
        if is_partial | (kv_base + self.block_n > kv_len):
            self.modify_scores(acc_s, is_partial, kv_base, tile_args, True)
            self.softmax_step(acc_s, row_max, row_sum, correction)
        else:
            self.modify_scores(acc_s, is_partial, kv_base, tile_args, False)
            self.softmax_step(acc_s, row_max, row_sum, correction)

    @cute.jit
    def modify_scores(self, acc_s, is_partial, kv_base, tile_args, masked: cutlass.Constexpr):
        """``acc_s`` <- mask_mod ? score_mod(S * sm_scale) : -inf per element (natural
        units), -inf past KV_LEN; ``masked`` False: score_mod alone (a full block's tile
        within KV_LEN). ``fold_scale``: the raw score S (the score_mod is the identity)."""
        cS, q_base, h_idx, b_idx, q_len, kv_len, captures = tile_args
        fold = self.config.fold_scale  # the identity score_mod, scaled in softmax_step
        scale = self.config.sm_scale
        neg_inf = -cutlass.Float32.inf
        b32 = cutlass.Int32(b_idx)
        h32 = cutlass.Int32(h_idx)
        for i in cutlass.range_constexpr(cute.size(acc_s)):
            crd = cS[i]
            q_in, q_idx = in_range(cutlass.Int32(q_base + crd[0]), q_len)
            kv_idx = cutlass.Int32(kv_base + crd[1])
            if cutlass.const_expr(masked):
                kv_in, kv_idx = in_range(kv_idx, kv_len)
                in_bounds = kv_in & q_in
                score_in = acc_s[i] if cutlass.const_expr(fold) else acc_s[i] * scale
                score = self.score_mod(score_in, b32, h32, q_idx, kv_idx, in_bounds, captures)
                # no branch per element: a row's (a column's) reads stay in one block, shared
                keep = self.mask_mod(b32, h32, q_idx, kv_idx, in_bounds, captures) | ~is_partial
                score = cutlass.select_(keep, score, neg_inf)
                acc_s[i] = cutlass.select_(kv_in, score, neg_inf)
            elif cutlass.const_expr(not fold):  # fold: the raw score stays
                acc_s[i] = self.score_mod(acc_s[i] * scale, b32, h32, q_idx, kv_idx, q_in,
                                          captures)

    @cute.jit
    def softmax_step(self, acc_s, row_max, row_sum, correction):
        """One tile of the online softmax: the row maxima (log2 units) and this thread's
        partial row sums updated, ``acc_s`` <- exp2(s log2e - max) (one FFMA and one ex2
        an element); ``correction`` <- the factors O's two rows are to be rescaled by.
        ``fold_scale``: ``acc_s`` holds raw scores, log2e becomes sm_scale log2e."""
        to_log2 = LOG2E * self.config.sm_scale if self.config.fold_scale else LOG2E
        s_mn = cute.make_tensor(acc_s.iterator, rows_cols(acc_s.layout, self.block_n))
        cols = cute.size(s_mn, mode=[1])
        for r in cutlass.range_constexpr(2):
            m_tile = tree_reduce([s_mn[r, c] for c in range(cols)], cute.arch.fmax)
            m_new = cute.arch.fmax(row_max[r], m_tile * to_log2)
            m_new = cute.arch.warp_reduction_max(m_new, threads_in_group=4)
            m_use = cutlass.select_(m_new == -cutlass.Float32.inf, cutlass.Float32(0.0), m_new)
            correction[r] = cute.math.exp2(row_max[r] - m_use, fastmath=True)
            row_max[r] = m_new
            for c in cutlass.range_constexpr(cols):
                s_mn[r, c] = cute.math.exp2(s_mn[r, c] * to_log2 - m_use, fastmath=True)
            p_sum = tree_reduce([s_mn[r, c] for c in range(cols)], operator.add)
            row_sum[r] = row_sum[r] * correction[r] + p_sum

    @cute.jit
    def rescale(self, acc_o, correction):
        """O's rows times their softmax corrections."""
        o_mn = cute.make_tensor(acc_o.iterator, rows_cols(acc_o.layout, self.head_dim))
        for r in cutlass.range_constexpr(2):
            for c in cutlass.range_constexpr(cute.size(o_mn, mode=[1])):
                o_mn[r, c] = o_mn[r, c] * correction[r]

    @cute.jit
    def finish(self, acc_o, row_max, row_sum, pv_thr, q_base, h_idx, b_idx, mO, mLSE, mMax,
               q_len):
        """O / l to ``mO`` (rows below Q_LEN), LSE and max (log2 units) to their rows."""
        d = self.head_dim
        if cutlass.const_expr(acc_o.layout.stride[0] != (1, 2, 4)):
            raise ValueError(f"Sm90FlexAttention: accumulator layout {acc_o.layout}")
        cO = pv_thr.partition_C(cute.make_identity_tensor((WGMMA_M, d)))
        inv = cute.make_rmem_tensor(cute.make_layout(2), cutlass.Float32)
        for r in cutlass.range_constexpr(2):
            total = cute.arch.warp_reduction_sum(row_sum[r], threads_in_group=4)
            safe = cutlass.select_(total == 0.0, cutlass.Float32(1.0), total)
            inv[r] = 1.0 / safe
            # value 2 r: row r's first column of this thread (column 0 for lane % 4 == 0)
            q_idx = q_base + cO[2 * r][0]
            if q_idx < q_len:
                if cO[2 * r][1] == 0:
                    m = row_max[r]
                    mLSE[b_idx, h_idx, q_idx] = m + cute.math.log2(safe, fastmath=False)
                    mMax[b_idx, h_idx, q_idx] = m
        # value i sits in row (i // 2) % 2 of the thread's two (stride (1, 2, 4))
        for i in cutlass.range_constexpr(cute.size(acc_o)):
            crd = cO[i]
            q_idx = q_base + crd[0]
            if q_idx < q_len:
                mO[b_idx, h_idx, q_idx, crd[1]] = (acc_o[i] * inv[(i // 2) % 2]).to(self.dtype)
