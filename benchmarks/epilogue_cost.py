"""What a fused epilogue costs each kind of GEMM kernel, at one shape (H200).

    python -m benchmarks.epilogue_cost [--shape 8192x4096x4096] [--rounds 2]
    python -m benchmarks.epilogue_cost --lower DIR [--shape ...]     # no GPU needed
    python -m benchmarks.epilogue_cost --from DIR [--rounds 2]       # on the GPU

For each of a few pinned configs (cooperative, ping-pong; the heuristic's ranking is
replaced by that one config) and each block (a GEMM and its pointwise consumer),
torch.compile runs with our GEMM and epilogue fusion on, and the compiled function is
timed in a CUDA graph; Inductor's default (cuBLAS + a Triton epilogue) is the reference.
Prints ms per block and the ratio to the plain mm of the same config, so the cost of
math (gelu), of extra loads (bias, residual) and of their mix can be told apart by kernel
kind. Each round measures everything again (run-to-run noise shows as their spread).

``--lower`` moves all compilation off the GPU machine: each config x block is lowered by
Inductor on a virtual sm_90 (``cutedsl_inductor.bench.lowering``), its kernels are compiled into the
kernel cache (``CUTEDSL_INDUCTOR_CACHE_DIR``) and its output code is written to
DIR/output_code.json.  ``--from DIR`` then runs that output code on the GPU (same cache
directory; the torch version that lowered it must be the GPU machine's), checks each
result against eager and times it; no Inductor default row.  A kernel change can so be
compared in one call by lowering the old and the new package into two directories and
timing them alternately, a few seconds per block instead of a torch.compile each.
``--clocks`` adds the SM clock and board power (``nvidia-smi``) while each block runs
back to back: a block that slows the clock (a power limit) costs time outside the kernel's
own schedule.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import torch
import torch.nn.functional as F
from torch._inductor.codecache import PyCodeCache

from cutedsl_inductor import config
from cutedsl_inductor.autotune.timing import median_ms
from cutedsl_inductor.bench.args import parse_rounds, parse_shapes
from cutedsl_inductor.bench.lowering import (
    kernel_definitions,
    load_kernels,
    lowered,
    virtual_sm90,
)
from cutedsl_inductor.bench.timing import clock_and_power
from cutedsl_inductor.kernels.gemm import template
from cutedsl_inductor.kernels.gemm.config import GemmConfig

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
    "128x256 c2x1 coop": GemmConfig(tile_m=128, tile_n=256, tile_k=64, cluster_m=2,
                                    cluster_n=1, cooperative=True, raster="m"),
    "256x128 c1x2 coop": GemmConfig(tile_m=256, tile_n=128, tile_k=64, cluster_m=1,
                                    cluster_n=2, cooperative=True, raster="n"),
    "128x128 c2x1 pp": GemmConfig(tile_m=128, tile_n=128, tile_k=64, cluster_m=2, cluster_n=1,
                                  cooperative=False, pingpong=True, raster="m"),
    "128x128 c1x2 pp": GemmConfig(tile_m=128, tile_n=128, tile_k=64, cluster_m=1, cluster_n=2,
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


def lower_blocks(shape: tuple[int, int, int], out_dir: str) -> None:
    """Lower every config x block on a virtual sm_90, compile its kernels, save the code."""
    m, n, k = shape
    codes: dict[str, dict[str, str]] = {}
    for label, cfg in CONFIGS.items():
        template.pick_configs = lambda *_, cfg=cfg, **__: [cfg]
        for name, fn in BLOCKS.items():
            with virtual_sm90(), torch._inductor.config.patch(
                    max_autotune=True, max_autotune_gemm_backends="CUTEDSL"), \
                    config.patch(epilogue_fusion=True, gemm_max_configs=1), \
                    lowered(fn, (m, k), (n, k), (n,), (m, n)) as graph:
                code = graph.codegen()[0].value
            load_kernels(kernel_definitions(code))
            codes.setdefault(label, {})[name] = code
            print(f"lowered {label:20s} {name}", flush=True)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "output_code.json"), "w") as f:
        json.dump({"shape": [m, n, k], "code": codes}, f)


def time_lowered(codes: dict[str, str], tensors: tuple, clocks: bool = False) -> list[float]:
    """ms of each block's saved output code, its result checked against eager; with
    ``clocks``, also prints the SM clock and board power while each block runs."""
    times = []
    for name, code in codes.items():
        module = PyCodeCache.load(code)
        (result,) = module.call(list(tensors))
        reference = BLOCKS[name](*tensors).double()
        error = ((result.double() - reference).norm() / reference.norm()).item()
        if not error < 1e-2:
            raise AssertionError(f"{name}: relative error {error}")
        times.append(median_ms(lambda: module.call(list(tensors)), cuda_graph=True))
        if clocks:
            mhz, watts = clock_and_power(lambda: module.call(list(tensors)))
            print(f"  {name:14s} {times[-1]:.4f} ms  SM {mhz:6.0f} MHz  {watts:5.0f} W")
    return times


def report(rows: dict[str, list[list[float]]], shape: tuple[int, int, int]) -> None:
    (m, n, k), rounds = shape, len(next(iter(rows.values())))
    print(f"\n{m}x{n}x{k} bf16: ms of the plain mm, then each block / plain mm "
          f"(min and max over {rounds} rounds)")
    print(f"{'config':20s} {'mm ms':>13} " + " ".join(f"{b:>13s}" for b in list(BLOCKS)[1:]))
    for label, measured in rows.items():
        cells = [f"{min(r[0] for r in measured):.4f}-{max(r[0] for r in measured):.4f}"]
        for i in range(1, len(BLOCKS)):
            ratios = [r[i] / r[0] for r in measured]
            cells.append(f"{min(ratios):.3f}-{max(ratios):.3f}")
        print(f"{label:20s} " + " ".join(f"{c:>13s}" for c in cells))


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.epilogue_cost",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=parse_shapes, default=[(8192, 4096, 4096)],
                        metavar="MxNxK")
    parser.add_argument("--rounds", type=parse_rounds, default=2)
    parser.add_argument("--lower", metavar="DIR", help="no GPU: lower and compile, save the "
                        "output code in DIR")
    parser.add_argument("--from", dest="lowered", metavar="DIR",
                        help="time the output code that --lower saved in DIR")
    parser.add_argument("--clocks", action="store_true", help="with --from: the SM clock and "
                        "power while each block runs (nvidia-smi)")
    args = parser.parse_args()
    (shape,) = args.shape
    if args.lower:
        lower_blocks(shape, args.lower)
        return 0
    saved = None
    if args.lowered:
        with open(os.path.join(args.lowered, "output_code.json")) as f:
            saved = json.load(f)
        shape = tuple(saved["shape"])
    m, n, k = shape
    tensors = tuple(torch.randn(*s, device="cuda", dtype=torch.bfloat16)
                    for s in ((m, k), (n, k), (n,), (m, n)))
    rows: dict[str, list[list[float]]] = {}
    for _ in range(args.rounds):
        if saved is not None:
            for label, codes in saved["code"].items():
                rows.setdefault(label, []).append(time_lowered(codes, tensors, args.clocks))
                print(f"{label:20s} " + " ".join(f"{t:.4f}" for t in rows[label][-1]), flush=True)
            continue
        for label, cfg in [("Inductor default", None), *CONFIGS.items()]:
            template.pick_configs = lambda *_, cfg=cfg, **__: [cfg]
            times = [time_block(fn, tensors, "default" if cfg is None else "ours")
                     for fn in BLOCKS.values()]
            rows.setdefault(label, []).append(times)
            print(f"{label:20s} " + " ".join(f"{t:.4f}" for t in times), flush=True)
    report(rows, shape)
    return 0


if __name__ == "__main__":
    sys.exit(main())
