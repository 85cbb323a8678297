"""``bench epilogue``'s summary line (no GPU needed)."""

from cutedsl_inductor.bench.epilogue import summarize


def row(block: str, ratio: float, low: float, ceiling: float) -> dict:
    return dict(block=block, m=1024, n=4096, k=14336, vs_max_autotune=ratio,
                vs_max_autotune_min=low, ceiling=ceiling)


def test_summary_names_the_blocks_whose_fusion_ceiling_is_below_the_goal():
    rows = [row("gelu(x@w.T+b)", 1.10, 1.06, 1.12), row("relu(addmm)*s+r", 1.01, 0.99, 1.03)]
    summary = summarize(rows)
    assert "geomean 1.054, worst 1.01; >= 1.05 on 1 of 2 blocks (in every round on 1)" in summary
    assert summary.endswith("below 1.05 on 1: relu(addmm)*s+r 1024x4096x14336 1.03")


def test_summary_has_no_ceiling_line_when_every_ceiling_reaches_the_goal():
    summary = summarize([row("gelu(x@w.T+b)", 1.10, 1.06, 1.12)])
    assert "ceiling" not in summary
