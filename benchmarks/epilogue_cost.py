#!/usr/bin/env python3
"""What a fused epilogue costs each kind of GEMM kernel, at one shape (H200).

    python benchmarks/epilogue_cost.py [--shape 8192x4096x4096] [--rounds 2]

For each of a few pinned configs (cooperative, ping-pong; the heuristic's ranking is
replaced by that one config) and each block (a GEMM and its pointwise consumer),
torch.compile runs with our GEMM and epilogue fusion on, and the compiled function is
timed in a CUDA graph; Inductor's default (cuBLAS + a Triton epilogue) is the reference.
Prints ms per block and the ratio to the plain mm of the same config, so the cost of
math (gelu), of extra loads (bias, residual) and of their mix can be told apart by kernel
kind. Each round measures everything again (run-to-run noise shows as their spread).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from cutedsl_inductor import config  # noqa: E402
from cutedsl_inductor.bench.gemm import parse_shapes  # noqa: E402
from cutedsl_inductor.bench.timing import median_ms  # noqa: E402
from cutedsl_inductor.templates.gemm import template  # noqa: E402

BLOCKS = {
    "mm": lambda x, w, b, r: x @ w.t(),
    "x*2": lambda x, w, b, r: (x @ w.t()) * 2.0,
    "gelu": lambda x, w, b, r: F.gelu(x @ w.t()),
    "+b": lambda x, w, b, r: x @ w.t() + b,
    "+r": lambda x, w, b, r: x @ w.t() + r,
    "gelu(+b)": lambda x, w, b, r: F.gelu(x @ w.t() + b),
    "relu(+b)*.5+r": lambda x, w, b, r: torch.relu(x @ w.t() + b) * 0.5 + r,
}
CONFIGS = {
    "128x256 c2x1 coop": dict(tile_m=128, tile_n=256, tile_k=64, cluster_m=2, cluster_n=1,
                              cooperative=True, raster="m"),
    "256x128 c1x2 coop": dict(tile_m=256, tile_n=128, tile_k=64, cluster_m=1, cluster_n=2,
                              cooperative=True, raster="n"),
    "128x128 c2x1 pp": dict(tile_m=128, tile_n=128, tile_k=64, cluster_m=2, cluster_n=1,
                            cooperative=False, pingpong=True, raster="m"),
    "128x128 c1x2 pp": dict(tile_m=128, tile_n=128, tile_k=64, cluster_m=1, cluster_n=2,
                            cooperative=False, pingpong=True, raster="n"),
}


def time_block(fn: Any, args: tuple, variant: str) -> float:
    """ms of ``fn`` compiled with our GEMM (the pinned config) or Inductor's default."""
    torch._dynamo.reset()
    inductor: dict[str, Any] = {"fx_graph_cache": False}
    if variant == "ours":
        inductor |= {"max_autotune": True, "max_autotune_gemm_backends": "CUTEDSL"}
    with torch._inductor.config.patch(**inductor), config.patch(epilogue_fusion=True):
        compiled = torch.compile(fn)
        compiled(*args)
    return median_ms(lambda: compiled(*args), cuda_graph=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", type=parse_shapes, default=[(8192, 4096, 4096)])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    (m, n, k), = args.shape
    tensors = tuple(torch.randn(*s, device="cuda", dtype=torch.bfloat16)
                    for s in ((m, k), (n, k), (n,), (m, n)))
    rows: dict[str, list[list[float]]] = {}
    for _ in range(args.rounds):
        for label, cfg in [("Inductor default", None), *CONFIGS.items()]:
            template.pick_configs = lambda *_, cfg=cfg, **__: [dict(cfg)]
            times = [time_block(fn, tensors, "default" if cfg is None else "ours")
                     for fn in BLOCKS.values()]
            rows.setdefault(label, []).append(times)
            print(f"{label:20s} " + " ".join(f"{t:.4f}" for t in times), flush=True)
    print(f"\n{m}x{n}x{k} bf16: ms of the plain mm, then each block / plain mm "
          f"(min and max over {args.rounds} rounds)")
    print(f"{'config':20s} {'mm ms':>13} " + " ".join(f"{b:>13s}" for b in list(BLOCKS)[1:]))
    for label, rounds in rows.items():
        cells = [f"{min(r[0] for r in rounds):.4f}-{max(r[0] for r in rounds):.4f}"]
        for i in range(1, len(BLOCKS)):
            ratios = [r[i] / r[0] for r in rounds]
            cells.append(f"{min(ratios):.3f}-{max(ratios):.3f}")
        print(f"{label:20s} " + " ".join(f"{c:>13s}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
