"""Timing shared by the benchmarks: medians of ``triton.testing.do_bench`` (CUDA events
around queued launches) or, with ``cuda_graph=True``, of ``do_bench_cudagraph`` (the
calls captured in a CUDA graph and replayed: GPU time only, as under
``torch.compile(mode="max-autotune")``, whatever the host cost per call).

``interleaved_ms`` compares several functions: it times each once per round, in turn,
so that the GPU's clock and temperature drifting over a run reach every function alike,
and keeps every round's median (their median is the figure; their spread shows how far
one comparison moves between rounds); ``fastest_by_median`` picks the fastest by its
median round; ``tflops_and_ratios`` turns the rounds into the benchmarks' rates and ratio
ranges.

``captured`` records a call of a function in a CUDA graph, so that functions compiled
under different Inductor settings (a ``torch._dynamo.reset()`` between them) can still
be timed in interleaved rounds: each graph's ``replay`` runs its function's kernels,
not Dynamo.

``clock_and_power`` samples ``nvidia-smi`` while a function runs back to back: the
SM clock a kernel holds under the board's power cap."""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from typing import Any


def median_ms(fn: Any, cuda_graph: bool = False, rep: int = 100) -> float:
    from triton.testing import do_bench, do_bench_cudagraph

    if cuda_graph:
        return do_bench_cudagraph(fn, rep=rep, return_mode="median")
    return do_bench(fn, warmup=25, rep=rep, return_mode="median")


def interleaved_ms(fns: dict[Any, Any], rounds: int, rep: int = 50) -> dict[Any, list[float]]:
    """Per name of ``fns``, the ``do_bench`` median (``rep`` ms of calls) of each of
    ``rounds`` rounds, every round timing the functions in the order given."""
    times: dict[Any, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(median_ms(fn, rep=rep))
    return times


def fastest_by_median(fns: dict[Any, Any], rounds: int) -> tuple[Any, dict[Any, float]]:
    """The name of the fastest of ``fns`` by median ``interleaved_ms`` round, and each
    one's median round (ms)."""
    medians = {name: statistics.median(per_round)
               for name, per_round in interleaved_ms(fns, rounds).items()}
    return min(medians, key=medians.__getitem__), medians


def tflops_and_ratios(times: dict[str, list[float]], flops: float,
                      refs: tuple[str, ...]) -> dict[str, float]:
    """From ``interleaved_ms``'s rounds: each name's TFLOP/s (its median round) and, for
    each name in ``refs``, ``vs_<ref>`` (``"ours"``'s TFLOP/s over the ref's) with that
    ratio's range over the rounds (``vs_<ref>_min``, ``vs_<ref>_max``)."""
    row = {name: flops / statistics.median(per_round) / 1e9 for name, per_round in times.items()}
    for ref in refs:
        row[f"vs_{ref}"] = row["ours"] / row[ref]
        ratios = [r / o for o, r in zip(times["ours"], times[ref])]
        row[f"vs_{ref}_min"], row[f"vs_{ref}_max"] = min(ratios), max(ratios)
    return row


def captured(fn: Any) -> Any:
    """A ``torch.cuda.CUDAGraph`` of one call of ``fn`` (warmed up on a side stream
    first, as capture requires); its replays do not depend on Dynamo's caches."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def clock_and_power(fn: Any, seconds: float = 2.0, settle: float = 0.5) -> tuple[float, float]:
    """Median SM clock (MHz) and board power (W) that ``nvidia-smi`` samples every 20 ms
    while ``fn`` runs back to back, from ``settle`` s after the start to ``seconds``."""
    import torch

    gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    query = ["nvidia-smi", "-i", gpu, "--query-gpu=clocks.sm,power.draw",
             "--format=csv,noheader,nounits", "-lms", "20"]
    start = time.monotonic()
    while time.monotonic() - start < settle:
        fn()
    sampler = subprocess.Popen(query, stdout=subprocess.PIPE, text=True)
    while time.monotonic() - start < seconds:
        fn()
    torch.cuda.synchronize()
    sampler.terminate()
    lines = sampler.communicate()[0].splitlines()
    samples = [tuple(map(float, line.split(","))) for line in lines if line.strip()]
    return (statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples))
