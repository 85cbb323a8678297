"""Timing shared by the benchmarks: medians of ``triton.testing.do_bench`` (CUDA events)."""

from __future__ import annotations

from typing import Any


def median_ms(fn: Any) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100, return_mode="median")
