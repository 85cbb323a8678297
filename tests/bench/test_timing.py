"""The benchmarks' arithmetic on timed rounds (no GPU needed)."""

import pytest

from cutedsl_inductor.autotune.timing import interleaved_ms
from cutedsl_inductor.bench.timing import round_speedup, tflops_and_ratios


def test_rates_come_from_median_rounds_and_ratios_from_each_round():
    # ms per round: ours 1.0, 2.0, 1.5; the reference twice as slow in the first round only
    times = {"ours": [1.0, 2.0, 1.5], "ref": [2.0, 2.0, 1.5]}
    row = tflops_and_ratios(times, 3e12, ("ref",))
    assert row["ours"] == pytest.approx(2000.0)  # 3e12 FLOPs in 1.5 ms
    assert row["ref"] == pytest.approx(1500.0)  # median round 2.0 ms
    assert row["vs_ref"] == pytest.approx(2000.0 / 1500.0)
    assert (row["vs_ref_min"], row["vs_ref_max"]) == pytest.approx((1.0, 2.0))


def test_a_speedup_is_the_median_of_the_per_round_ratios():
    # max-autotune's ms and ours in five interleaved rounds: the clock drops in round 3
    ref, ours = [10.0, 10.2, 13.0, 10.1, 9.9], [9.0, 9.5, 12.9, 9.0, 9.4]
    speedup, low, high = round_speedup(ref, ours)
    assert speedup == pytest.approx(10.2 / 9.5)  # the median round ratio
    assert (low, high) == pytest.approx((13.0 / 12.9, 10.1 / 9.0))


def test_interleaved_rounds_take_each_name_in_turn_with_a_measure_of_ours():
    order = []

    def measure(name):
        order.append(name)
        return float(len(order))

    times = interleaved_ms({"a": "a", "b": "b"}, 3, measure=measure)
    assert order == ["a", "b"] * 3
    assert times == {"a": [1.0, 3.0, 5.0], "b": [2.0, 4.0, 6.0]}
