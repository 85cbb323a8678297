"""The benchmarks' arithmetic on timed rounds (no GPU needed)."""

import pytest

from cutedsl_inductor.bench.timing import tflops_and_ratios


def test_rates_come_from_median_rounds_and_ratios_from_each_round():
    # ms per round: ours 1.0, 2.0, 1.5; the reference twice as slow in the first round only
    times = {"ours": [1.0, 2.0, 1.5], "ref": [2.0, 2.0, 1.5]}
    row = tflops_and_ratios(times, 3e12, ("ref",))
    assert row["ours"] == pytest.approx(2000.0)  # 3e12 FLOPs in 1.5 ms
    assert row["ref"] == pytest.approx(1500.0)  # median round 2.0 ms
    assert row["vs_ref"] == pytest.approx(2000.0 / 1500.0)
    assert (row["vs_ref_min"], row["vs_ref_max"]) == pytest.approx((1.0, 2.0))
