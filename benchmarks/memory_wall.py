#!/usr/bin/env python3
"""How close the memory-bound GEMMs come to the HBM read wall (bf16, one H200).

    python benchmarks/memory_wall.py [--shapes 16x128256x4096,64x128256x4096] [--layouts nt,nn]

At small M an LM head's GEMM streams its weight once: its time is the weight's bytes
over the bandwidth the kernel draws.  Per shape and layout this times, in interleaved
rounds (``timing.interleaved_ms``: ``do_bench`` medians, L2 flushed), our fastest
offered config (``bench.gemm.ours_best``), ``torch.mm`` (cuBLAS), Inductor's best
Triton template, and the wall: the fastest of a few Triton kernels that only read the
same weight (each program summing a contiguous stretch; the configs picked by their
median round first).  Prints each GEMM's bandwidth (its operands' and output's bytes
over its median round) and its fraction of the wall's.  Kernels come from the kernel
cache (``CUTEDSL_INDUCTOR_CACHE_DIR``) or compile here.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys

import torch
import triton
import triton.language as tl

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from cutedsl_inductor.bench.gemm import (  # noqa: E402
    operands, ours_best, parse_rounds, parse_shapes, triton_compiled)
from cutedsl_inductor.bench.timing import fastest_by_median, interleaved_ms  # noqa: E402

READ_CONFIGS = [(block, steps, warps) for block in (2048, 8192) for steps in (4, 16)
                for warps in (4, 8)]


@triton.jit
def _read_sum(src, partial, numel, BLOCK: tl.constexpr, STEPS: tl.constexpr):
    start = tl.program_id(0).to(tl.int64) * BLOCK * STEPS
    total = tl.zeros([BLOCK], tl.float32)
    for step in range(STEPS):
        offsets = start + step * BLOCK + tl.arange(0, BLOCK)
        total += tl.load(src + offsets, mask=offsets < numel, other=0.0).to(tl.float32)
    tl.store(partial + tl.program_id(0), tl.sum(total))


def read_call(weight: torch.Tensor, block: int, steps: int, warps: int):
    flat = weight.view(-1) if weight.is_contiguous() else weight.t().view(-1)
    grid = triton.cdiv(flat.numel(), block * steps)
    partial = torch.empty(grid, device=weight.device, dtype=torch.float32)
    return functools.partial(_read_sum[(grid,)], flat, partial, flat.numel(), BLOCK=block,
                             STEPS=steps, num_warps=warps)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", type=parse_shapes,
                        default=parse_shapes("16x128256x4096,64x128256x4096"))
    parser.add_argument("--layouts", default="nt,nn")
    parser.add_argument("--rounds", type=parse_rounds, default=5)
    args = parser.parse_args()
    print(f"{'M':>4} {'N':>7} {'K':>5} {'B':>3}  {'wall TB/s':>9}  "
          "TB/s (of the wall): ours, cuBLAS, Triton   read config; our config", flush=True)
    for m, n, k in args.shapes:
        for layout in args.layouts.split(","):
            a, b = operands(m, n, k, torch.bfloat16, layout)
            reads = {cfg: read_call(b, *cfg) for cfg in READ_CONFIGS}
            read_cfg, _ = fastest_by_median(reads, 3)
            ours, config = ours_best(a, b)
            fns = {"ours": ours, "cublas": lambda: torch.mm(a, b),
                   "triton": triton_compiled(a, b), "wall": reads[read_cfg]}
            times = interleaved_ms(fns, args.rounds)
            weight = b.numel() * b.element_size()
            moved = {"wall": weight}
            moved |= dict.fromkeys(("ours", "cublas", "triton"),
                                   weight + (m * k + m * n) * a.element_size())
            rate = {name: moved[name] / statistics.median(ms) / 1e9
                    for name, ms in times.items()}
            gemms = ", ".join(f"{rate[name]:.2f} ({rate[name] / rate['wall']:.3f})"
                              for name in ("ours", "cublas", "triton"))
            print(f"{m:>4} {n:>7} {k:>5} {layout:>3}  {rate['wall']:9.2f}  {gemms}   "
                  f"block {read_cfg[0]} x{read_cfg[1]}, {read_cfg[2]} warps; "
                  f"{config.removeprefix('CuteDSL sm90_gemm ')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
