#!/usr/bin/env python3
"""Our best offered GEMM config against cuBLAS under four timing harnesses (bf16).

    python benchmarks/gemm_harness_probe.py --shapes 128x4096x4096,1024x1024x1024 [--layouts nn]

Per shape and layout, our fastest offered config (``bench.gemm.ours_best``) and
``torch.mm`` are timed in 3 interleaved rounds of each harness, each round the median of
60 calls between CUDA events:

- ``memset``: a 256 MB memset before every call, as ``triton.testing.do_bench`` (and so
  ``bench gemm``) flushes L2; it leaves L2 full of dirty lines that the timed kernel's
  reads must write back;
- ``memset+read``: the same, then a 256 MB read, so that L2 holds clean lines only;
- ``events``: no flush; with kernels shorter than their host launch cost this measures
  the host, not the GPU;
- ``graph``: 50 calls back to back in one CUDA graph, L2 warm, no host in the way.

A ratio that moves between harnesses points at the memory system (dirty or warm L2)
rather than at the kernel's own cycles.  Kernels come from the kernel cache
(``CUTEDSL_INDUCTOR_CACHE_DIR``) or compile here.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Any

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from cutedsl_inductor import config  # noqa: E402
from cutedsl_inductor.bench.gemm import operands, ours_best, parse_shapes  # noqa: E402
from cutedsl_inductor.bench.timing import captured  # noqa: E402

_FLUSH_BYTES = 256 * 1024 * 1024


def events_us(fn: Any, before: Any, calls: int = 60) -> float:
    """Median µs of ``fn`` between two CUDA events, ``before()`` run ahead of each call."""
    pairs = []
    for _ in range(calls):
        before()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        pairs.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in pairs) * 1e3


def graph_us(fn: Any, calls: int = 50) -> float:
    """µs per call of ``calls`` calls of ``fn`` replayed from one CUDA graph (median of 5)."""
    graph = captured(lambda: [fn() for _ in range(calls)])
    graph.replay()
    return events_us(graph.replay, lambda: None, calls=5) / calls


def harnesses() -> dict[str, Any]:
    dirty = torch.empty(_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    clean = torch.ones(_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    return {
        "memset": lambda fn: events_us(fn, dirty.zero_),
        "memset+read": lambda fn: events_us(fn, lambda: (dirty.zero_(), clean.max())),
        "events": lambda fn: events_us(fn, lambda: None),
        "graph": graph_us,
    }


def probe(m: int, n: int, k: int, layout: str, timers: dict[str, Any]) -> None:
    a, b = operands(m, n, k, torch.bfloat16, layout)
    ours, description = ours_best(a, b)
    fns = {"ours": ours, "cublas": lambda: torch.mm(a, b)}
    print(f"\n{m}x{n}x{k} {layout}: {description}")
    for harness, timer in timers.items():
        rounds: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(3):
            for name, fn in fns.items():
                rounds[name].append(timer(fn))
        us = {name: statistics.median(r) for name, r in rounds.items()}
        print(f"  {harness:12s} ours {us['ours']:8.2f} us  cuBLAS {us['cublas']:8.2f} us  "
              f"cuBLAS / ours {us['cublas'] / us['ours']:.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=parse_shapes, required=True, metavar="MxNxK,...")
    parser.add_argument("--layouts", default="nn")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    timers = harnesses()
    with config.patch(arch="sm_90a", disk_cache=True):
        for m, n, k in args.shapes:
            for layout in args.layouts.split(","):
                probe(m, n, k, layout, timers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
