"""Timing for the benchmarks, on top of ``autotune/timing.py`` (the medians and
interleaved rounds that autotuning's retiming uses too): ``tflops_and_ratios`` turns the
rounds into the benchmarks' rates and ratio ranges; ``round_speedup`` is a speedup as the
median of the per-round ratios, with their range (``bench model``'s).

``captured`` records a call of a function in a CUDA graph, so that functions compiled
under different Inductor settings (a ``torch._dynamo.reset()`` between them) can still
be timed in interleaved rounds: each graph's ``replay`` runs its function's kernels,
not Dynamo.

``median_call_ms`` times a given number of calls after a given number of warm-ups (for
benchmarks whose calls are long enough to time one by one, such as attention's).

``clock_and_power`` samples ``nvidia-smi`` while a function runs back to back: the
SM clock a kernel holds under the board's power cap."""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from typing import Any


def tflops_and_ratios(times: dict[str, list[float]], flops: float,
                      refs: tuple[str, ...], subject: str = "ours") -> dict[str, float]:
    """From ``interleaved_ms``'s rounds: each name's TFLOP/s (its median round) and, for
    each name in ``refs``, ``vs_<ref>`` (``subject``'s TFLOP/s over the ref's) with that
    ratio's range over the rounds (``vs_<ref>_min``, ``vs_<ref>_max``)."""
    row = {name: flops / statistics.median(per_round) / 1e9 for name, per_round in times.items()}
    for ref in refs:
        row[f"vs_{ref}"] = row[subject] / row[ref]
        ratios = [r / o for o, r in zip(times[subject], times[ref])]
        row[f"vs_{ref}_min"], row[f"vs_{ref}_max"] = min(ratios), max(ratios)
    return row


def round_speedup(ref_ms: list[float], ms: list[float]) -> tuple[float, float, float]:
    """The speedup over a reference timed in the same interleaved rounds: the median of
    the per-round ratios (the reference's ms over this one's), and their min and max."""
    ratios = [ref / own for ref, own in zip(ref_ms, ms, strict=True)]
    return statistics.median(ratios), min(ratios), max(ratios)


def median_call_ms(fn: Any, steps: int, warmup: int, cuda: bool = True) -> float:
    """The median ms of ``steps`` calls of ``fn`` after ``warmup`` untimed ones: each call
    between two CUDA events, all queued back to back and synchronized once at the end
    (``cuda=False``: the wall clock around each call, for CPU tensors)."""
    import torch

    for _ in range(warmup):
        fn()
    if not cuda:
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(steps)]
    for begin, end in events:
        begin.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(begin.elapsed_time(end) for begin, end in events)


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
