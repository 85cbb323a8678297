"""``bench gemm``'s plot, drawn from the H200 suite's CSV: ratios to cuBLAS and Triton on
a screen-sized image, titled with the setup the rows name."""

import math
from pathlib import Path

import pytest

from cutedsl_inductor.bench.gemm import SETUP_FIELDS, read_rows
from cutedsl_inductor.bench.gemm_plot import _ticks, range_bars, setup_line, write_plot

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "benchmarks" / "results" / "gemm_suite_h200.csv"


def test_the_suite_plot_fits_a_screen(tmp_path):
    image = pytest.importorskip("matplotlib.image")
    write_plot(read_rows(SUITE), tmp_path / "gemm_bench.png")
    height, width, _ = image.imread(tmp_path / "gemm_bench.png").shape
    assert 1000 <= width <= 1600 and 500 <= height <= 1000


def test_the_title_names_the_gpu_and_versions_of_the_rows():
    rows = read_rows(SUITE)
    assert setup_line(rows) == "NVIDIA H200, torch 2.11, CuTe DSL 4.8.1"
    older = [{key: value for key, value in row.items() if key not in SETUP_FIELDS}
             for row in rows]
    assert setup_line(older) == "GPU and versions not recorded"


def test_the_ratio_ticks_hold_one_and_spread_out():
    assert _ticks(0.8, 6.0) == [0.8, 1.0, 1.25, 2.0, 3.0, 4.0, 6.0]
    assert _ticks(0.9, 1.3) == [0.9, 0.95, 1.0, 1.05, 1.1, 1.25]


def test_range_bars_are_never_negative_and_zero_where_a_bound_is_missing():
    rows = [{"r": 1.0, "r_min": 0.9, "r_max": 1.2},
            {"r": 1.0000001, "r_min": 0.99, "r_max": 1.0},  # a rounding above its range
            {"r": 2.0, "r_min": math.nan, "r_max": math.nan},
            {"r": 3.0}]
    low, high = range_bars(rows, "r")
    assert low == pytest.approx([0.1, 0.0100001, 0.0, 0.0])
    assert high == pytest.approx([0.2, 0.0, 0.0, 0.0])
