#!/usr/bin/env python3
"""Split a GEMM's time into a fixed part and a per-K part, ours against cuBLAS (bf16).

    python benchmarks/gemm_tile_cost.py --mn 4096x4096 [--ks 1024,2048,4096,8192]
        [--layouts nt,nn] [--ranked 2] [--rounds 5]

For one M x N and several K, cuBLAS and the heuristic's first ``--ranked`` configs
(through the template path, each checked against float64 first) are timed in
interleaved rounds (``timing.interleaved_ms``).  A least-squares line t(K) = a + b K per
kernel then tells where time goes: ``a`` (us) is what does not grow with K (launch,
prologue, every tile's epilogue, the last wave's idle SMs), ``b`` the mainloop's cost per
K (shown as the TFLOP/s the mainloop alone would reach).  Two kernels with equal ``b`` and
different ``a`` differ in their epilogues or tile schedule, not in their mainloops.
Kernels come from the kernel cache (``CUTEDSL_INDUCTOR_CACHE_DIR``) or compile here;
``--precompile`` only compiles them (no GPU needed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from cutedsl_inductor.bench.sweep import sweep_choices  # noqa: E402
from cutedsl_inductor import config  # noqa: E402
from cutedsl_inductor.bench.gemm import checked_run, operands, parse_rounds  # noqa: E402
from cutedsl_inductor.bench.timing import interleaved_ms  # noqa: E402


def scan(m: int, n: int, ks: list[int], layout: str, ranked: int, rounds: int) -> None:
    """Print each kernel's median us per K and its line fit."""
    times: dict[str, list[float]] = {}
    for k in ks:
        a, b = operands(m, n, k, torch.bfloat16, layout)
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        reference = a.double() @ b.double()
        fns = {"cuBLAS": lambda a=a, b=b: torch.mm(a, b)}
        for cfg, _, choice in sweep_choices(m, n, k, layout, [], ranked):
            run = checked_run(choice, (a, b), out, reference)
            fns[cfg.name] = lambda run=run, a=a, b=b, out=out: run(a, b, out)
        for name, per_round in interleaved_ms(fns, rounds).items():
            times.setdefault(name, []).append(1e3 * statistics.median(per_round))
    print(f"\n{m}x{n}xK {layout}: us per K in {ks}; fit t = a + b K")
    for name, us in times.items():
        if len(us) != len(ks):  # the heuristic ranked it at some K only
            continue
        per_k, fixed = statistics.linear_regression(ks, us)
        mainloop_tflops = 2 * m * n / per_k / 1e6
        print(f"  {name:36s} " + " ".join(f"{t:8.1f}" for t in us)
              + f"   a {fixed:6.1f} us   mainloop {mainloop_tflops:5.0f} TFLOP/s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mn", required=True, metavar="MxN")
    parser.add_argument("--ks", default="1024,2048,4096,8192")
    parser.add_argument("--layouts", default="nt")
    parser.add_argument("--ranked", type=int, default=2, metavar="N")
    parser.add_argument("--rounds", type=parse_rounds, default=5)
    parser.add_argument("--precompile", action="store_true",
                        help="compile the configs into the kernel cache (no GPU needed)")
    args = parser.parse_args(argv)
    m, n = (int(d) for d in args.mn.lower().split("x"))
    ks = [int(k) for k in args.ks.split(",")]
    with config.patch(arch="sm_90a", disk_cache=True):
        for layout in args.layouts.split(","):
            if args.precompile:
                for k in ks:
                    for _, _, choice in sweep_choices(m, n, k, layout, [], args.ranked):
                        choice.load()
                print(f"{m}x{n} {layout}: compiled or cached")
            elif torch.cuda.is_available():
                scan(m, n, ks, layout, args.ranked, args.rounds)
            else:
                print("needs a CUDA GPU (or --precompile)")
                return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
