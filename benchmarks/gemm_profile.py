"""Run cuBLAS and some of our GEMM configs at one shape, for a profiler (bf16).

    ncu -k regex:"nvjet|sm90_gemm" --launch-skip 3 --launch-count 3 \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \\
        python -m benchmarks.gemm_profile 8192x4096x4096 nn \\
            t128x256x64_c2x1_coop_rm t256x128x64_c1x2_coop_rn

Each kernel runs twice, in the order cuBLAS, then the configs named (``config_name``, among
the heuristic's first ``--ranked`` candidates at that shape or their ``--variant`` copies,
as in ``bench sweep``), so that skipping the first round (``--launch-skip`` = 1 + number
of configs) profiles warm launches of each.  ncu locks the SM clock (``--clock-control
base``, its default): its cycle counts compare the kernels' schedules without the power cap
that moves clocks in timed runs.
"""

from __future__ import annotations

import argparse
import sys

import torch

from cutedsl_inductor import config
from cutedsl_inductor.bench.args import parse_count, parse_shapes
from cutedsl_inductor.bench.gemm import operands
from cutedsl_inductor.bench.sweep import parse_variant, sweep_choices


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gemm_profile",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("shape", type=parse_shapes, metavar="MxNxK")
    parser.add_argument("layout", choices=("nt", "nn"))
    parser.add_argument("configs", nargs="+", metavar="CONFIG_NAME")
    parser.add_argument("--ranked", type=parse_count, default=8, metavar="N")
    parser.add_argument("--variant", type=parse_variant, action="append", default=[],
                        metavar="KEY=VALUE,...")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    (m, n, k), = args.shape
    a, b = operands(m, n, k, torch.bfloat16, args.layout)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    with config.patch(arch="sm_90a", disk_cache=True):
        choices = sweep_choices(m, n, k, args.layout, args.variant, args.ranked)
        runs = {cfg.name: choice.load().run for cfg, _, choice in choices}
    missing = [name for name in args.configs if name not in runs]
    if missing:
        print(f"not among the first {args.ranked} candidates: {missing}; ranked: {list(runs)}")
        return 2
    for _ in range(2):
        torch.mm(a, b)
        for name in args.configs:
            runs[name](a, b, out)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
