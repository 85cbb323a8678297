"""Timing shared by autotuning's retiming and the benchmarks: medians of
``triton.testing.do_bench`` (CUDA events around queued launches) or, with
``cuda_graph=True``, of ``do_bench_cudagraph`` (the calls captured in a CUDA graph and
replayed: GPU time only, as under ``torch.compile(mode="max-autotune")``, whatever the
host cost per call).

``interleaved_ms`` compares several functions: it times each once per round, in turn,
so that the GPU's clock and temperature drifting over a run reach every function alike,
and keeps every round's median (their median is the figure; their spread shows how far
one comparison moves between rounds); ``fastest_by_median`` picks the fastest by its
median round."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any


def median_ms(fn: Any, cuda_graph: bool = False, rep: int = 100) -> float:
    from triton.testing import do_bench, do_bench_cudagraph

    if cuda_graph:
        return do_bench_cudagraph(fn, rep=rep, return_mode="median")
    return do_bench(fn, warmup=25, rep=rep, return_mode="median")


def interleaved_ms(fns: dict[Any, Any], rounds: int, rep: int = 50,
                   measure: Callable[[Any], float] | None = None) -> dict[Any, list[float]]:
    """Per name of ``fns``, the ms of each of ``rounds`` rounds, every round timing the
    functions in the order given: ``measure(fn)``, by default the ``do_bench`` median of
    ``rep`` ms of calls."""
    times: dict[Any, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(measure(fn) if measure else median_ms(fn, rep=rep))
    return times


def fastest_by_median(fns: dict[Any, Any], rounds: int) -> tuple[Any, dict[Any, float]]:
    """The name of the fastest of ``fns`` by median ``interleaved_ms`` round, and each
    one's median round (ms)."""
    medians = {name: statistics.median(per_round)
               for name, per_round in interleaved_ms(fns, rounds).items()}
    return min(medians, key=medians.__getitem__), medians
