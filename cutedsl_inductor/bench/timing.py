"""Timing shared by the benchmarks: medians of ``triton.testing.do_bench`` (CUDA events
around queued launches) or, with ``cuda_graph=True``, of ``do_bench_cudagraph`` (the
calls captured in a CUDA graph and replayed: GPU time only, as under
``torch.compile(mode="max-autotune")``, whatever the host cost per call)."""

from __future__ import annotations

from typing import Any


def median_ms(fn: Any, cuda_graph: bool = False) -> float:
    from triton.testing import do_bench, do_bench_cudagraph

    if cuda_graph:
        return do_bench_cudagraph(fn, rep=100, return_mode="median")
    return do_bench(fn, warmup=25, rep=100, return_mode="median")
