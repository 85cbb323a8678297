"""SDPA as flex_attention's HOP arguments, for our FlexAttention choice of an SDPA
(``inductor/sdpa.py``): the BlockMask, the score_mod / mask_mod / joint graphs and the
kernel options that Inductor's flex lowerings take.

The BlockMask has 128x128 blocks. Causal (Lq = Lk, n blocks a side): in row block r
the diagonal block is partial (``kv_indices[r, 0] = r``) and blocks 0..r-1 full
(``full_kv_indices[r, c] = c``); transposed, column block r has q block r partial and
r+1..n-1 full (``(r + 1 + c) mod n``). Otherwise every block is full. Only the first
``num_blocks`` entries of a row are read; the rest is any valid index. The tables are
int32 pointwise computations in the graph (``tables``), and real tensors of the same
values for autotuning (``table_tensors``: flex's own fake tables time every block).
Only the block tuple's layout differs between torch releases (2.13 adds four
backward-only entries, passed as None): ``_extra_entries`` reads it from torch.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import sympy
import torch
from torch.utils._sympy.functions import ModularIndexing

aten = torch.ops.aten
BLOCK = 128
TABLE_NAMES = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
               "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices")


@dataclasses.dataclass(frozen=True)
class Blocks:
    """The BlockMask's block counts: ``nq`` query blocks, ``nk`` KV blocks."""

    nq: int
    nk: int
    causal: bool

    def tables(self) -> dict[str, tuple[tuple[int, ...], Callable[..., Any]]]:
        """name -> (size, f(row, col, mod)), the value of each entry."""
        nq, nk = self.nq, self.nk
        if self.causal:
            return {
                "kv_num_blocks": ((1, 1, nq), lambda r, c, mod: 1 + 0 * r),
                "kv_indices": ((1, 1, nq, nk), lambda r, c, mod: r + 0 * c),
                "full_kv_num_blocks": ((1, 1, nq), lambda r, c, mod: r),
                "full_kv_indices": ((1, 1, nq, nk), lambda r, c, mod: c + 0 * r),
                "q_num_blocks": ((1, 1, nk), lambda r, c, mod: 1 + 0 * r),
                "q_indices": ((1, 1, nk, nq), lambda r, c, mod: r + 0 * c),
                "full_q_num_blocks": ((1, 1, nk), lambda r, c, mod: nq - 1 - r),
                "full_q_indices": ((1, 1, nk, nq), lambda r, c, mod: mod(r + 1 + c, nq)),
            }
        return {
            "kv_num_blocks": ((1, 1, nq), lambda r, c, mod: 0 * r),
            "kv_indices": ((1, 1, nq, nk), lambda r, c, mod: 0 * (r + c)),
            "full_kv_num_blocks": ((1, 1, nq), lambda r, c, mod: nk + 0 * r),
            "full_kv_indices": ((1, 1, nq, nk), lambda r, c, mod: c + 0 * r),
            "q_num_blocks": ((1, 1, nk), lambda r, c, mod: 0 * r),
            "q_indices": ((1, 1, nk, nq), lambda r, c, mod: 0 * (r + c)),
            "full_q_num_blocks": ((1, 1, nk), lambda r, c, mod: nq + 0 * r),
            "full_q_indices": ((1, 1, nk, nq), lambda r, c, mod: c + 0 * r),
        }


def blocks_for(lq: int, lk: int, causal: bool) -> Blocks:
    return Blocks(-(-lq // BLOCK), -(-lk // BLOCK), causal)


def tables(blocks: Blocks, device: torch.device) -> dict[str, Any]:
    """The tables as Inductor IR (int32 pointwise nodes)."""
    from torch._inductor import ir
    from torch._inductor.virtualized import ops

    def mod(x: Any, n: int) -> Any:
        return ModularIndexing(x, 1, n)

    made = {}
    for name, (size, value) in blocks.tables().items():
        def inner(index: list[Any], value: Callable[..., Any] = value) -> Any:
            row = index[2]
            col = index[3] if len(index) > 3 else sympy.Integer(0)
            return ops.index_expr(sympy.sympify(value(row, col, mod)), torch.int32)

        made[name] = ir.Pointwise.create(device=device, dtype=torch.int32, inner_fn=inner,
                                         ranges=[sympy.Integer(s) for s in size])
    return made


def table_tensors(blocks: Blocks, device: torch.device) -> dict[str, torch.Tensor]:
    """The same tables as tensors on ``device`` (for autotuning)."""
    made = {}
    for name, (size, value) in blocks.tables().items():
        row = torch.arange(size[2], device=device).view(-1, 1)
        col = torch.arange(size[3] if len(size) > 3 else 1, device=device).view(1, -1)
        full = value(row, col, lambda x, n: x % n).to(torch.int32)
        made[name] = (full if len(size) > 3 else full[:, 0]).expand(size).contiguous()
    return made


@functools.cache
def _extra_entries() -> int:
    """How many entries this torch's BlockMask tuple has between the tables and the
    block sizes (0 in 2.11, 4 in 2.13)."""
    from torch.nn.attention.flex_attention import _create_empty_block_mask

    x = torch.empty(1, 1, 1, 8)
    return len(_create_empty_block_mask(x, x).as_tuple()) - 13


def block_mask(lq: int, lk: int, ir_tables: dict[str, Any], mask: Any) -> tuple[Any, ...]:
    """flex's BlockMask tuple: lengths, the eight tables, this torch's extra entries, the
    block sizes and the mask_mod subgraph."""
    return (lq, lk, *(ir_tables[n] for n in TABLE_NAMES), *(None,) * _extra_entries(),
            BLOCK, BLOCK, mask)


def _trace(fn: Callable[..., Any], *examples: torch.Tensor) -> torch.fx.GraphModule:
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn)(*examples)


def _index() -> torch.Tensor:
    return torch.zeros((), dtype=torch.int32)


@functools.cache
def graphs(dtype: torch.dtype, causal: bool, with_bias: bool) -> tuple[Any, Any, Any]:
    """(score_mod, its joint graph, mask_mod) as graph modules: the score plain or plus
    ``bias[b, h, m, n]`` (no gradient), the mask ``m >= n`` or none."""
    score = torch.zeros((), dtype=dtype)
    idx = [_index() for _ in range(4)]
    extra = [torch.zeros(1, 1, 1, 1, dtype=dtype)] if with_bias else []

    def score_mod(s: Any, b: Any, h: Any, m: Any, n: Any, *bias: Any) -> Any:
        return s + aten.index(bias[0], [b, h, m, n]) if bias else s

    def joint(s: Any, b: Any, h: Any, m: Any, n: Any, grad: Any, *bias: Any) -> Any:
        return [grad, None, None, None, None, *(None for _ in bias)]

    def causal_mask(b: Any, h: Any, m: Any, n: Any) -> Any:
        return m >= n

    def no_mask(b: Any, h: Any, m: Any, n: Any) -> Any:  # never called: all blocks full
        return n >= 0

    return (_trace(score_mod, score, *idx, *extra),
            _trace(joint, score, *idx, score, *extra),
            _trace(causal_mask if causal else no_mask, *idx))


def subgraph(name: str, gm: torch.fx.GraphModule) -> Any:
    from torch._inductor import ir

    return ir.Subgraph(name=name, graph_module=gm)


def kernel_options(dtype: torch.dtype, device: torch.device) -> dict[str, Any]:
    """flex's kernel options for our choice (the Triton template path, CUTEDSL on)."""
    from torch._inductor.virtualized import V
    from torch.nn.attention.flex_attention import _apply_kernel_options

    with V.fake_mode:
        x = torch.empty(1, 1, 1, 1, dtype=dtype, device=device)
        options = _apply_kernel_options(x, x, x, True, {"BACKEND": "TRITON"})
    return {**options, "CUTEDSL": True}
