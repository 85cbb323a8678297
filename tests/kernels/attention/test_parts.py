"""The persistent forward's walk (``parts.persistent_grid``, ``parts.persistent_tile``),
run as CuTe DSL host code on the CPU: every tile once, a (batch, head)'s last Q tiles
first, and under a causal mask (tile m costs m + 1 KV tiles) the CTAs' walks about equally
long, where a fixed stride alone (132 CTAs over 16 Q tiles a head) left them 1.21x apart."""

import cutlass
import cutlass.cute as cute
import pytest
import torch
from cutlass.cute.runtime import from_dlpack

from cutedsl_inductor.kernels.attention.parts import persistent_grid, persistent_tile
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
