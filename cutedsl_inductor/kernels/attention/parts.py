"""The pieces both FlexAttention kernels (``sm90_flex.py``, ``sm90_flex_bwd.py``) use:
views of WGMMA accumulators, the rule that keeps hook indices in range, and the walk
over a BlockMask's block lists.

Accumulator views: a 64 x N fp32 WGMMA accumulator holds, per thread, values of layout
``((2, 2, N / 8), 1, 1)`` with stride ``(1, 2, 4)``: value 0 the column pair, value 1
the row 8 below, value 2 the 8-column block.

The BlockMask walk, as flex's Triton kernels read it: the tile holding row ``tile *
rows`` of the CTA's dimension lies in sparse block ``tile * rows // sparse_block`` of
batch ``b % SPARSE_B``, head ``h % SPARSE_H``; that block lists ``num`` partial blocks
(``idx``), then ``full_num`` full ones (``full_idx``). Each listed block is
``per_block`` tiles of the other dimension, of which the first ``steps`` are walked (a
block reaching past the other length stops at its last tile). Producer and consumers
walk the same list, so they agree on every tile.

The persistent forward's walk: CTA c takes steps c, c + grid, c + 2 grid, ... (round k
= step // grid). Step ``j`` is Q tile ``q_tiles - 1 - j % q_tiles`` of (batch, head) ``j
// q_tiles``: a (batch, head)'s Q tiles are neighbours (its K and V stay in L2 while the
CTAs walking them run), its last -- the longest under a causal mask -- first. Where a
round holds whole (batch, head)s (``grid`` a multiple of ``q_tiles``), every odd round
that is full runs backwards (a snake), so a CTA's long tile of one round pairs with a
short one of the next: with a fixed stride alone, 132 CTAs over 16 Q tiles a head give
CTA c the tiles ``c % 4`` apart from the longest, and the walks' lengths differ by up to
40%. ``persistent_grid`` picks the grid.

The backward's longest-first order (``longest_first``): CTA ``linear`` of a 1-D grid
takes tile ``within // section`` of head ``section * s + within % section`` (section
``s = linear // (section * tiles)``, ``within`` the rest): each section of ``section``
heads, whose Q and dO stay in L2 together, is walked tile 0 of every head first, then
tile 1, ... Under a causal mask the dK/dV kernel's low KV tiles walk the most Q steps, so
the long CTAs start first and the last wave holds short ones. ``section`` divides the
heads (``lpt_section``), so every section is whole.
"""

import cutlass
import cutlass.cute as cute

LOG2E = 1.4426950408889634


def rows_cols(layout, cols):
    """The (2 rows, cols / 2 per thread) view of a 64 x ``cols`` accumulator's values."""
    st = layout.stride[0]
    return cute.make_layout((2, (2, cols // 8)), stride=(st[1], (st[0], st[2])))


def as_a_operand(layout, cols):
    """The same registers as the A operand of an m64 k16 WGMMA: per k-block of 16 the
    values ((2 columns, 2 rows, 2 halves of 8 columns), 1, cols / 16)."""
    st = layout.stride[0]
    return cute.make_layout(((2, 2, 2), 1, cols // 16),
                            stride=((st[0], st[1], st[2]), 0, 2 * st[2]))


def tree_reduce(values, op):
    """``op`` over ``values`` as a balanced tree (a dependency chain log2(n) deep, not n)."""
    while len(values) > 1:
        pairs = [op(values[i], values[i + 1]) for i in range(0, len(values) - 1, 2)]
        values = pairs + values[len(values) - len(values) % 2:]
    return values[0]


def in_range(idx, length):
    """(idx < length, idx where it is, else 0): the index the hooks see, always in range,
    so that their captured reads need no per-element guard."""
    inside = idx < length
    return inside, cutlass.Int32(cutlass.select_(inside, idx, cutlass.Int32(0)))


@cute.jit
def block_list(lists, has_full: cutlass.Constexpr, tile, rows, sparse_block, h_idx, b_idx):
    """The walk's state for the tile at row ``tile * rows``: (sparse batch, sparse head,
    sparse block, partial count, full count, partial list, full list). ``lists`` is
    (num, idx, full_num, full_idx); without full blocks their count is 0."""
    num, idx, full_num, full_idx = lists
    sb = b_idx % num.shape[0]
    sh = h_idx % num.shape[1]
    blk = (tile * rows) // sparse_block
    partial = cutlass.Int32(num[sb, sh, blk])
    full = cutlass.Int32(0)
    if cutlass.const_expr(has_full):
        full = cutlass.Int32(full_num[sb, sh, blk])
    return sb, sh, blk, partial, full, idx, full_idx


def walk_length(blocks, steps):
    """Tiles walked: every listed block's first ``steps``."""
    return (blocks[3] + blocks[4]) * steps


@cute.jit
def walk_tile(blocks, has_full: cutlass.Constexpr, t, per_block, steps):
    """The tile index of step ``t`` of the walk, and whether its block is partial."""
    sb, sh, blk, partial, full, idx, full_idx = blocks
    j = t // steps
    sub = t - j * steps
    block = cutlass.Int32(0)
    is_partial = j < partial
    if is_partial:
        block = cutlass.Int32(idx[sb, sh, blk, j])
    else:
        if cutlass.const_expr(has_full):
            block = cutlass.Int32(full_idx[sb, sh, blk, j - partial])
    return block * per_block + sub, is_partial


def persistent_grid(q_tiles: int, tiles: int, sms: int) -> int:
    """The persistent walk's CTAs: one a tile where there are fewer than two tiles an SM
    (the hardware's scheduling balances them, the long ones first); else whole (batch,
    head)s a round where one fits in the SMs (the snake pairs long and short tiles); else
    one a SM. Static sizes only."""
    if not all(isinstance(n, int) for n in (q_tiles, tiles)):
        raise ValueError("the persistent FlexAttention forward takes static shapes")
    if tiles < 2 * sms:
        return tiles
    return sms // q_tiles * q_tiles if q_tiles <= sms else sms


@cute.jit
def persistent_tile(step, q_tiles, heads, tiles, grid):
    """(Q tile, head, batch) of step ``step`` of the persistent walk (``tiles`` in all,
    ``grid`` a round)."""
    k = step // grid
    snake = (k % 2 == 1) & ((k + 1) * grid <= tiles) & (grid % q_tiles == 0)
    j = cutlass.Int32(cutlass.select_(snake, (2 * k + 1) * grid - 1 - step, step))
    bh = j // q_tiles
    m_block = q_tiles - 1 - (j - bh * q_tiles)
    b_idx = bh // heads
    return m_block, bh - b_idx * heads, b_idx


def lpt_section(head_bytes: int, heads: int, budget: int) -> int:
    """The heads of one section of the longest-first order: the largest power of two that
    divides ``heads`` and whose heads' ``head_bytes`` each fit in ``budget`` (at least 1).
    Static sizes only."""
    section = 1
    while heads % (2 * section) == 0 and 2 * section * head_bytes <= budget:
        section *= 2
    return section


def longest_first(linear, tiles, section):
    """(tile, head) of CTA ``linear`` in the longest-first order (Python or DSL integers;
    ``tiles`` and ``section`` static)."""
    per = section * tiles
    s = linear // per
    within = linear - s * per
    tile = within // section
    return tile, s * section + within - tile * section
