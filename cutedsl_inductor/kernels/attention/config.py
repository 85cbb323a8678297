"""FlexConfig: the compile-time constants of one FlexAttention forward kernel.

A frozen, validated record: ``FlexConfig(...)`` raises ``ValueError`` for a combination
the kernel cannot run (a head dim other than 64/128, a KV tile that does not divide the
BlockMask's KV block, a ring that does not fit in shared memory), so a refused choice
names its reason before anything is traced. ``persistent`` doubles Q's shared memory
(two Q buffers: the next tile's loads while one runs). ``fold_scale`` (the template sets
it where the score_mod is the identity) needs ``sm_scale > 0``: the row max is taken
over the raw scores and scaled after.
"""

from __future__ import annotations

import dataclasses

from ..sm90 import SMEM_BYTES

BLOCK_M = 128  # query rows per CTA: two consumer warpgroups of 64 rows each
HEAD_DIMS = (64, 128)


@dataclasses.dataclass(frozen=True)
class FlexConfig:
    head_dim: int  # of Q, K and V (one for all three)
    block_n: int  # KV rows per pipeline stage
    stages: int  # K/V ring depth
    sparse_q_block: int  # the BlockMask's Q block size (a multiple of BLOCK_M)
    sparse_kv_block: int  # its KV block size (a multiple of block_n)
    has_full_blocks: bool  # whether the BlockMask lists full blocks (no mask_mod there)
    sm_scale: float
    pipelined: bool = True  # softmax overlapped with the GEMMs (False: the serial mainloop)
    pingpong: bool = False  # the consumer warpgroups take turns issuing their GEMMs
    element_bytes: int = 2
    persistent: bool = False  # one CTA per SM walking the Q tiles, Q double-buffered
    fold_scale: bool = False  # score_mod the identity: sm_scale folded into exp2's FFMA

    def __post_init__(self) -> None:
        if self.head_dim not in HEAD_DIMS:
            raise ValueError(f"head dim {self.head_dim} is not one of {HEAD_DIMS}")
        if self.block_n not in (64, 128) or self.stages < 2:
            raise ValueError(f"block_n {self.block_n} / stages {self.stages} unsupported")
        if self.sparse_q_block % BLOCK_M:
            raise ValueError(f"the BlockMask's Q block size {self.sparse_q_block} is not a "
                             f"multiple of {BLOCK_M}")
        if self.sparse_kv_block % self.block_n:
            raise ValueError(f"the BlockMask's KV block size {self.sparse_kv_block} is not a "
                             f"multiple of block_n={self.block_n}")
        if self.fold_scale and not self.sm_scale > 0:
            raise ValueError(f"sm_scale {self.sm_scale} cannot be folded into the exp2 "
                             f"(the row max of the raw scores needs a positive scale)")
        if self.pingpong and not self.pipelined:
            raise ValueError("ping-pong turns are taken in the pipelined mainloop only")
        if self.smem_bytes() > SMEM_BYTES:
            raise ValueError(f"{self.stages} stages of {self.block_n}x{self.head_dim} K and V "
                             f"need {self.smem_bytes()} bytes of shared memory")

    def smem_bytes(self) -> int:
        q = BLOCK_M * self.head_dim * self.element_bytes * self.q_stages
        kv = 2 * self.block_n * self.head_dim * self.element_bytes * self.stages
        return q + kv + 1024 * 4

    @property
    def kv_tiles_per_block(self) -> int:
        return self.sparse_kv_block // self.block_n

    @property
    def q_stages(self) -> int:
        """Q tiles in shared memory: persistent, the next tile's loads while this one runs."""
        return 2 if self.persistent else 1


def default_configs(head_dim: int, sparse_q_block: int, sparse_kv_block: int,
                    has_full_blocks: bool, sm_scale: float,
                    pipelined: bool = True, pingpong: bool = False,
                    persistent: bool = False, fold_scale: bool = False) -> list[FlexConfig]:
    """The configs offered for a problem, best guess first; those that do not fit are
    left out (an empty list: nothing suits)."""
    shapes = [(128, 2), (64, 3)] if head_dim == 128 else [(128, 3), (64, 4)]
    out = []
    for block_n, stages in shapes:
        try:
            out.append(FlexConfig(head_dim, block_n, stages, sparse_q_block, sparse_kv_block,
                                  has_full_blocks, sm_scale, pipelined,
                                  pingpong and pipelined, persistent=persistent,
                                  fold_scale=fold_scale))
        except ValueError:
            continue
    return out


def persistent_twin(cfg: FlexConfig) -> list[FlexConfig]:
    """``cfg`` made persistent, where its second Q buffer fits (else none)."""
    try:
        return [dataclasses.replace(cfg, persistent=True)]
    except ValueError:
        return []
