"""FlexBwdConfig: the compile-time constants of one FlexAttention backward
(``sm90_flex_bwd.py``: two kernels, or one with ``fused_dq``).

A frozen, validated record: ``FlexBwdConfig(...)`` raises ``ValueError`` for what the
kernels cannot run (a head dim other than 64/128, a BlockMask whose blocks are no
multiples of the tiles, rings that do not fit in shared memory), so a refused choice
names its reason before anything is traced.
"""

from __future__ import annotations

import dataclasses

from ..sm90 import SMEM_BYTES
from .config import HEAD_DIMS

KV_TILE = 128  # dK/dV kernel: KV rows per CTA, 64 per consumer warpgroup
Q_STEP = 64  # dK/dV kernel: Q rows per pipeline stage
Q_TILE = 128  # dQ kernel: Q rows per CTA, 64 per consumer warpgroup
KV_STEP = 64  # dQ kernel: KV rows per pipeline stage
# longest-first dK/dV order: the Q and dO bytes one section's heads may hold in L2 (an
# H100's is 50 MB; K and V stream past)
LPT_L2_BYTES = 32 << 20


@dataclasses.dataclass(frozen=True)
class FlexBwdConfig:
    head_dim: int  # of Q, K and V (one for all three)
    stages: int  # depth of both kernels' rings (Q/dO tiles; K/V tiles)
    sparse_q_block: int  # the BlockMask's Q block size (a multiple of Q_TILE)
    sparse_kv_block: int  # its KV block size (a multiple of KV_TILE)
    has_full_blocks: bool  # whether the BlockMask lists full blocks (no mask_mod there)
    sm_scale: float
    pipelined: bool = True  # dK/dV: P and dS overlapped with the GEMMs (False: serial)
    # dQ accumulated by the dK/dV kernel (TMA reduce-adds of fp32 tiles into a workspace,
    # then cast): five GEMMs per tile pair, not the dQ kernel's three more
    fused_dq: bool = False
    # dK/dV CTAs in the longest-first order (``parts.longest_first``: a 1-D grid, KV tile 0
    # of each L2-sized section of heads first)
    lpt: bool = False
    # dK/dV: each step's S^T GEMM issued before the last step's dV and dK are waited for
    # (pipelined, two kernels)
    early_s: bool = False
    element_bytes: int = 2

    def __post_init__(self) -> None:
        if self.head_dim not in HEAD_DIMS:
            raise ValueError(f"head dim {self.head_dim} is not one of {HEAD_DIMS}")
        if self.early_s and (self.fused_dq or not self.pipelined):
            raise ValueError("early S^T takes the pipelined dK/dV step without fused dQ")
        if self.stages < 2:
            raise ValueError(f"stages {self.stages} unsupported")
        if self.sparse_q_block % Q_TILE:
            raise ValueError(f"the BlockMask's Q block size {self.sparse_q_block} is not a "
                             f"multiple of {Q_TILE}")
        if self.sparse_kv_block % KV_TILE:
            raise ValueError(f"the BlockMask's KV block size {self.sparse_kv_block} is not a "
                             f"multiple of {KV_TILE}")
        if self.smem_bytes() > SMEM_BYTES:
            raise ValueError(f"{self.stages} stages of head dim {self.head_dim} need "
                             f"{self.smem_bytes()} bytes of shared memory")

    def smem_bytes(self) -> int:
        """The larger of the two kernels' (both resident tiles of 128 rows plus a ring of
        two 64-row tiles per stage; fused: a Q_STEP x KV_TILE dS tile per stage and a
        Q_STEP-row fp32 dQ tile too)."""
        row = self.head_dim * self.element_bytes
        fused = 0
        if self.fused_dq:
            fused = (self.stages * Q_STEP * KV_TILE * self.element_bytes
                     + Q_STEP * self.head_dim * 4)
        return 2 * 128 * row + self.stages * 2 * 64 * row + fused + 1024 * 4


def default_bwd_configs(head_dim: int, sparse_q_block: int, sparse_kv_block: int,
                        has_full_blocks: bool, sm_scale: float, pipelined: bool = True,
                        fused_dq: bool = False, lpt: bool = False,
                        early_s: bool = False) -> list[FlexBwdConfig]:
    """The configs offered, best guess first; those that do not fit are left out."""
    out = []
    for stages in ((2,) if head_dim == 128 else (3, 2)):
        try:
            out.append(FlexBwdConfig(head_dim, stages, sparse_q_block, sparse_kv_block,
                                     has_full_blocks, sm_scale, pipelined, fused_dq, lpt,
                                     early_s))
        except ValueError:
            continue
    return out
