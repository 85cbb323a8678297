"""Split-K inside one cluster: ``split_k`` CTAs share an output tile, each over its own
contiguous, balanced range of K tiles, their fp32 partial sums reduced through
distributed shared memory (no workspace, no atomics).

Reduce-scatter: every CTA writes its fragment into its own smem reduction buffer (one
accumulator tile: the ring cannot serve, the producer already prefetches the next tile
into it) and arrives (release, cluster scope) on each peer's "ready" mbarrier; epilogue
unit u belongs to rank ``u % split_k``, which waits on its "ready", adds the peers'
values of its units into ``acc`` through DSMEM (``ld.shared::cluster``, the same
per-thread fragment layout) and arrives on each peer's "free" mbarrier; a CTA waits on
its "free" before it rewrites its buffer for the next tile and before it exits. Each
CTA then runs the epilogue for its own units only, so the fusion hook sees each full
sum exactly once.
"""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass._mlir.dialects import nvvm

from .epilogue import epi_slice


@cute.jit
def split_k_range(gemm: Any, cta_rank: Any, cta_crd: Any, k_tiles: Any) -> Any:
    """(split rank, rank of the tile's split-rank-0 CTA, first K tile, K tiles) of this
    CTA: the CTAs of one output tile are ranks ``split_base + cluster_m * r``; a range is
    empty where ``k_tiles < split_k``. Without split-K the whole K range (base None)."""
    split = gemm.split_k
    split_base = None
    if cutlass.const_expr(split > 1):
        split_rank = cta_crd[2]
        split_base = cta_rank - gemm.cluster_m * split_rank
        k_base = k_tiles // split
        k_extra = k_tiles - k_base * split
        k_begin = split_rank * k_base + min(split_rank, k_extra)
        my_k_tiles = (split_rank + 1) * k_base + min(split_rank + 1, k_extra) - k_begin
    else:
        split_rank = cutlass.Int32(0)
        k_begin = cutlass.Int32(0)
        my_k_tiles = k_tiles
    return split_rank, split_base, k_begin, my_k_tiles


@cute.jit
def init_reduce_barriers(gemm: Any, warp: Any, reduce_ready: Any, reduce_free: Any) -> None:
    """The "ready" and "free" mbarriers (each counts the peers' consumer warps); fenced
    and made cluster-visible by the ring's creation, which follows."""
    if cutlass.const_expr(gemm.split_k > 1):
        if warp == 0:
            with cute.arch.elect_one():
                arrivals = (gemm.split_k - 1) * (gemm.num_consumer_threads // 32)
                cute.arch.mbarrier_init(reduce_ready, arrivals)
                cute.arch.mbarrier_init(reduce_free, arrivals)


class SplitKReduce:
    """One consumer thread's side of the reduce-scatter. Its buffer slot: thread t's
    fragment element v sits at (v // 4) * 4T + 4t + v % 4 (T consumer threads), so every
    access is a 16-byte vector and a warp's accesses are contiguous."""

    def __init__(self, gemm):
        self.gemm = gemm

    def setup(self, acc, reduce_ptr, reduce_ready, reduce_free, ctid, split_rank, split_base):
        """The consumer thread's buffer views (while the kernel is traced)."""
        gemm = self.gemm
        self.ctid = ctid
        self.reduce_ptr, self.ready, self.free = reduce_ptr, reduce_ready, reduce_free
        self.split_rank, self.split_base = split_rank, split_base
        frag = cute.size(acc)
        self.acc_flat = cute.make_tensor(acc.iterator, cute.make_layout(frag))
        self.partial = cute.make_rmem_tensor((gemm.epi_unit,), gemm.acc_dtype)
        nthr = gemm.num_consumer_threads
        self.layout = cute.make_layout(((4, frag // 4), nthr), stride=((1, 4 * nthr), 4))
        self.my_slot = cute.make_tensor(reduce_ptr, self.layout)[(None, ctid)]
        self.lane = cute.arch.lane_idx()

    def peer_rank(self, peer: int) -> Any:
        return self.split_base + self.gemm.cluster_m * peer

    @cute.jit
    def reduce(self, tiles_done):
        """Publish this tile's partial sums once the peers have read the last ones, then
        add the peers' partials of the epilogue units this CTA owns into ``acc``."""
        split, unit = self.gemm.split_k, self.gemm.epi_unit
        acc_flat, partial = self.acc_flat, self.partial
        cute.arch.mbarrier_wait(self.free, (tiles_done + 1) % 2)
        cute.arch.fence_acq_rel_cluster()  # the peers' reads before our writes
        cute.autovec_copy(acc_flat, self.my_slot)
        cute.arch.sync_warp()
        if self.lane == 0:
            cute.arch.fence_acq_rel_cluster()
            self.arrive_on_peers(self.ready)
        cute.arch.mbarrier_wait(self.ready, tiles_done % 2)
        cute.arch.fence_acq_rel_cluster()
        for u in cutlass.range_constexpr(cute.size(acc_flat) // unit):
            if u % split == self.split_rank:
                for peer in cutlass.range_constexpr(split):
                    if peer != self.split_rank:
                        peer_slot = cute.make_tensor(
                            cute.arch.map_dsmem_ptr(self.reduce_ptr, self.peer_rank(peer)),
                            self.layout)[(None, self.ctid)]
                        cute.autovec_copy(epi_slice(peer_slot, u, (unit,)), partial)
                        for v in cutlass.range_constexpr(unit):
                            acc_flat[u * unit + v] += partial[v]
        # each warp hands the peers' buffers back once it has read them
        cute.arch.sync_warp()
        if self.lane == 0:
            self.arrive_on_peers(self.free)

    @cute.jit
    def arrive_on_peers(self, barrier):
        for peer in cutlass.range_constexpr(self.gemm.split_k):
            if peer != self.split_rank:
                cute.arch.mbarrier_arrive(barrier, self.peer_rank(peer),
                                          scope=nvvm.MemScopeKind.CLUSTER)

    @cute.jit
    def wait_free(self, tiles_done):
        """Before the CTA exits: its peers have read its last partials."""
        cute.arch.mbarrier_wait(self.free, (tiles_done + 1) % 2)
