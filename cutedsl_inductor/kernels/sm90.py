"""What every Hopper (sm_90a) kernel of ours takes as given: the warpgroup, WGMMA's M,
shared memory per CTA, and the named barriers each kernel uses.

Named barriers are ``bar.sync``/``bar.arrive`` ids, 16 per CTA; id 0 is
``__syncthreads``. Ids are per kernel: two kernels may reuse an id, one kernel never
uses an id for two purposes, which one enum per kernel makes visible.
"""

from __future__ import annotations

import enum

THREADS_PER_WG = 128  # threads of a warpgroup, the unit of WGMMA and of setmaxnreg
WGMMA_M = 64  # rows of one WGMMA (a warpgroup's share of a tile)
SMEM_BYTES = 227 * 1024  # dynamic shared memory a CTA may use
SMS = 132  # SMs of an H100 SXM / H200: a persistent kernel's grid (fewer SMs: a second wave)


class GemmBarrier(enum.IntEnum):
    """``kernels/gemm``: each consumer warpgroup's epilogue (its own threads), and the
    ping-pong warpgroups' turns (256 threads)."""
    EPILOGUE_WG0 = 1
    EPILOGUE_WG1 = 2
    TURN_WG0 = 3
    TURN_WG1 = 4


class FlexBarrier(enum.IntEnum):
    """The FlexAttention forward: the ping-pong consumer warpgroups' turns (256 threads;
    warpgroup w waits on ``TURN_WG1 + w - 1``)."""
    TURN_WG1 = 1
    TURN_WG2 = 2


class FlexBwdBarrier(enum.IntEnum):
    """The FlexAttention backward's fused dQ: both consumer warpgroups have written their
    halves of a Q step's dS tile into shared memory (256 threads), so its dQ GEMM may
    read it; warpgroup w has written its half of the step's dQ (its 128 threads,
    ``DQ_WRITTEN_WG1 + w - 1``), so its TMA may add that half to the accumulator."""
    DS_WRITTEN = 1
    DQ_WRITTEN_WG1 = 2
    DQ_WRITTEN_WG2 = 3
