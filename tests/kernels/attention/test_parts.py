"""The persistent forward's walk (``parts.persistent_grid``, ``parts.persistent_tile``),
run as CuTe DSL host code on the CPU: every tile once, a (batch, head)'s last Q tiles
first, and under a causal mask (tile m costs m + 1 KV tiles) the CTAs' walks about equally
long, where a fixed stride alone (132 CTAs over 16 Q tiles a head) left them 1.21x apart.

The backward's longest-first order (``parts.longest_first``, ``parts.lpt_section``): every
(KV tile, head) once, whole L2 sections, each section's tile 0 first; under a causal mask
(KV tile n walks 2 (16 - n) Q steps at 2048 rows), hardware-like greedy dispatch to 132
SMs ends within 2% of the even share, where the grid's order (tiles fastest) ends 7% past
it."""

import cutlass
import cutlass.cute as cute
import pytest
import torch
from cutlass.cute.runtime import from_dlpack

from cutedsl_inductor.kernels.attention.bwd_config import LPT_L2_BYTES
from cutedsl_inductor.kernels.attention.parts import (
    longest_first,
    lpt_section,
    persistent_grid,
    persistent_tile,
)
from cutedsl_inductor.kernels.sm90 import SMS


@cute.jit
def _walk(out: cute.Tensor, q_tiles: cutlass.Int32, heads: cutlass.Int32,
          tiles: cutlass.Int32, grid: cutlass.Int32):
    for step in cutlass.range(tiles, unroll=1):
        m_block, h_idx, b_idx = persistent_tile(step, q_tiles, heads, tiles, grid)
        out[step, 0] = m_block
        out[step, 1] = h_idx
        out[step, 2] = b_idx


def walk(batch, heads, q_len):
    """(grid, (Q tile, head, batch) of every step)."""
    q_tiles = (q_len + 127) // 128
    tiles = batch * heads * q_tiles
    grid = persistent_grid(q_tiles, tiles, SMS)
    out = torch.full((tiles, 3), -1, dtype=torch.int32)
    _walk(from_dlpack(out), q_tiles, heads, tiles, grid)
    return grid, out


@pytest.mark.parametrize("batch, heads, q_len, grid, spread", [
    (8, 16, 2048, 128, 1.0),  # whole heads a round, the snake: every walk equally long
    (4, 32, 8192, 128, 1.0),
    (1, 32, 32768, 132, 1.03),  # a head's tiles more than the SMs: the stride alone
    (4, 16, 1029, 126, 1.3),  # 4.6 rounds: the last, partial one unpaired
    # fewer tiles than two an SM: one CTA a tile, balanced by the hardware's scheduling
    (2, 4, 1000, 64, None),
])
def test_the_walk_takes_every_tile_once_and_balances_causal_work(batch, heads, q_len, grid,
                                                                 spread):
    got_grid, out = walk(batch, heads, q_len)
    assert got_grid == grid
    q_tiles = (q_len + 127) // 128
    seen = {tuple(row) for row in out.tolist()}
    assert seen == {(m, h, b) for m in range(q_tiles) for h in range(heads)
                    for b in range(batch)}
    # within a (batch, head), the longest tiles are taken first
    first = out[:q_tiles].tolist()
    assert [m for m, _, _ in first] == list(range(q_tiles - 1, -1, -1))
    if spread is None:
        return
    work = torch.zeros(grid, dtype=torch.int64)
    work.index_add_(0, torch.arange(len(out)) % grid, out[:, 0].long() + 1)
    assert work.max().item() <= spread * work.float().mean().item() + 1e-9, work.tolist()


def test_the_grid_takes_static_shapes():
    with pytest.raises(ValueError, match="static shapes"):
        persistent_grid(cutlass.Int32(16), 2048, SMS)


@cute.jit
def _order(out: cute.Tensor, tiles: cutlass.Constexpr, section: cutlass.Constexpr):
    for linear in cutlass.range(out.shape[0], unroll=1):
        tile, head = longest_first(linear, tiles, section)
        out[linear, 0] = tile
        out[linear, 1] = head


def _makespan(costs, sms=SMS):
    """When the last of ``costs`` (in launch order) ends, each started on the first SM
    free: the hardware's dispatch of a grid's CTAs, one a SM."""
    import heapq

    free = [0] * sms
    end = 0
    for cost in costs:
        start = heapq.heappop(free)
        end = max(end, start + cost)
        heapq.heappush(free, start + cost)
    return end


@pytest.mark.parametrize("head_bytes, heads, section", [
    (1 << 20, 128, 32),  # 8 x 16 heads of Q and dO at 2048 x 128 bf16: 32 MB a section
    (1 << 20, 96, 32),
    (1 << 20, 12, 4),  # the largest power of two dividing the heads
    (3 << 20, 128, 8),
    (64 << 20, 16, 1),  # one head's Q and dO past the budget: one a section
])
def test_the_lpt_sections_fit_l2_and_divide_the_heads(head_bytes, heads, section):
    assert lpt_section(head_bytes, heads, LPT_L2_BYTES) == section


def test_the_longest_first_order_takes_every_tile_once_and_ends_the_causal_walk_early():
    tiles, heads = 16, 128
    section = lpt_section(1 << 20, heads, LPT_L2_BYTES)
    out = torch.full((tiles * heads, 2), -1, dtype=torch.int32)
    _order(from_dlpack(out), tiles, section)
    order = [tuple(row) for row in out.tolist()]
    assert set(order) == {(n, h) for n in range(tiles) for h in range(heads)}
    for s in range(heads // section):  # whole sections, tile 0 of each head first
        part = order[s * section * tiles:(s + 1) * section * tiles]
        assert {h for _, h in part} == set(range(s * section, (s + 1) * section))
        assert [n for n, _ in part] == sorted(n for n, _ in part)
    steps = [2 * (tiles - n) + 1 for n, _ in order]  # Q steps, and one for the CTA's ends
    even = sum(steps) / SMS
    grid = [2 * (tiles - n) + 1 for h in range(heads) for n in range(tiles)]
    assert _makespan(steps) <= 1.02 * even, (_makespan(steps), even)
    assert _makespan(grid) >= 1.06 * even, (_makespan(grid), even)
