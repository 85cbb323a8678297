"""``python -m cutedsl_inductor bench epilogue``: GEMM blocks with pointwise epilogues,
fused into our GEMM, against Inductor's default and max-autotune (Triton epilogue
fusion), measured in one run.

Blocks (bf16): gelu(x @ w.T + b); relu(addmm(b, x, w.T)) * 0.5 + residual;
silu(x @ w1.T) * (x @ w3.T) (ours: one two-weight GEMM, ``inductor/swiglu.py``).
Shapes: M in {128, 1024, 8192} x the GEMM suite's four (N, K) (``gemm.LLM_NK``: a square
weight, an MLP's up and down projections, an LM head); ``--quick``: M in {128, 8192},
(4096, 4096); ``--shapes MxNxK,...``: those;
``--shard K/N``: every N-th shape from the K-th, to split the suite across GPUs or runs,
each writing its own CSV. Ours: max-autotune with
``max_autotune_gemm_backends="CUTEDSL"`` and ``config.epilogue_fusion``. Each result is
checked against eager (relative error < 1e-2) and our output code against fusion (the
"fused" column: every consumer ran inside a GEMM).

Timing: each variant's compiled function is captured in a CUDA graph right after its
compile (``timing.captured``; the next variant's ``torch._dynamo.reset()`` leaves the
graph valid), one call per graph.  The three graphs are then timed in ``--rounds``
interleaved rounds (``timing.interleaved_ms``: ``do_bench``, which flushes L2 before each
replay, as Inductor's autotuning does and as a model's weights are when their layer
comes round again; the flush also hides a replay's launch from the timing), the median
round counting and each ratio's range over the rounds printed and kept.  Prints TFLOP/s
(GEMM FLOPs over time), the ratios and the configs of our GEMM kernels, and writes them
to ``--out``/epilogue_bench.csv row by row (what was measured survives a run cut short).

The fusion ceiling: in the same rounds, the block's GEMMs alone (eager ``torch.mm``:
cuBLAS, no bias, no pointwise op) are timed too; ``ceiling`` is max-autotune's time over
theirs, the ratio a fused kernel reaches if it runs its GEMMs at cuBLAS's rate and its
epilogue costs nothing.  A block whose ceiling is below the goal meets it only with a
GEMM faster than cuBLAS.  (SwiGLU's two-weight kernel is one GEMM twice as wide, which
can outrun two cuBLAS GEMMs, so its ceiling is no bound; an epilogue that reads a
residual adds bytes that even a free epilogue moves, so where the weight's stream
bounds the GEMM, e.g. the LM head at M = 128, the ceiling is above what is reachable.)
"""

from __future__ import annotations

import argparse
import ast
import csv
import math
import re
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .. import config
from ..autotune.timing import interleaved_ms
from .args import output_folder, parse_rounds, parse_shapes, parse_shard
from .gemm import LLM_NK, ROUNDS
from .timing import captured, tflops_and_ratios

SHAPES = [(m, n, k) for m in (128, 1024, 8192) for n, k in LLM_NK]
QUICK = [(128, 4096, 4096), (8192, 4096, 4096)]
VARIANTS = ("ours", "default", "max_autotune")


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


def blocks(m: int, n: int, k: int) -> dict[str, tuple[Any, Any, tuple[torch.Tensor, ...], int]]:
    """name -> (function, its GEMMs alone, arguments, GEMM FLOPs)."""
    x, w, w3, b, r = _randn(m, k), _randn(n, k), _randn(n, k), _randn(n), _randn(m, n)
    gemm = 2 * m * n * k
    return {
        "gelu(x@w.T+b)": (lambda x, w, b: F.gelu(x @ w.t() + b),
                          lambda x, w, b: x @ w.t(), (x, w, b), gemm),
        "relu(addmm)*s+r": (lambda x, w, b, r: torch.relu(torch.addmm(b, x, w.t())) * 0.5 + r,
                            lambda x, w, b, r: x @ w.t(), (x, w, b, r), gemm),
        "silu(x@w1.T)*(x@w3.T)": (lambda x, w1, w3: F.silu(x @ w1.t()) * (x @ w3.t()),
                                  lambda x, w1, w3: (x @ w1.t(), x @ w3.t()),
                                  (x, w, w3), 2 * gemm),
    }


def compiled(fn: Any, args: tuple[torch.Tensor, ...], variant: str) -> tuple[Any, bool, str]:
    """The compiled function, whether every consumer ran inside a GEMM kernel (an
    epilogue, or SwiGLU's two-weight kernel), and the configs of our GEMM kernels in its
    output code."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    inductor = {"fx_graph_cache": False}
    if variant != "default":
        inductor |= {"max_autotune": True,
                     "max_autotune_gemm_backends": "CUTEDSL" if variant == "ours" else "ATEN,TRITON"}
    with torch._inductor.config.patch(**inductor), config.patch(epilogue_fusion=variant == "ours"):
        out = torch.compile(fn)
        result, codes = run_and_get_code(out, *args)
    reference = fn(*args).double()
    error = ((result.double() - reference).norm() / reference.norm()).item()
    if not error < 1e-2:
        raise AssertionError(f"{variant}: relative error {error}")
    code = "\n".join(codes)
    fused = "_epilogue(" in code or "'SWIGLU':" in code
    return out, fused and "triton_poi" not in code, gemm_configs(code)


def gemm_configs(code: str) -> str:
    """``"128x256x64 c2x1 coop, ..."``: the configs of the GEMM kernels in output code."""
    names = []
    for match in re.finditer(r"template='sm90_gemm',\s*params=(\{[^}]*\})", code):
        p = ast.literal_eval(match.group(1))
        kind = "pp" if p["PINGPONG"] else "coop" if p["COOPERATIVE"] else "1wg"
        split = f" k{p['SPLIT_K']}" if "SPLIT_K" in p else ""
        swiglu = " swiglu" if "SWIGLU" in p else ""
        names.append(f"{p['TILE_M']}x{p['TILE_N']}x{p['TILE_K']} "
                     f"c{p['CLUSTER_M']}x{p['CLUSTER_N']} {kind}{split}{swiglu}")
    return ", ".join(names)


CSV_FIELDS = ["block", "m", "n", "k", "ours", "default", "max_autotune", "gemm_alone",
              "vs_default", "vs_max_autotune", "vs_default_min", "vs_default_max",
              "vs_max_autotune_min", "vs_max_autotune_max", "ceiling", "fused", "our_configs"]
GOAL = 1.05  # of Inductor max-autotune, on every block


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="M in {128, 8192}, (4096, 4096)")
    parser.add_argument("--shapes", type=parse_shapes, metavar="MxNxK,...",
                        help="these shapes instead of the suite")
    parser.add_argument("--shard", type=parse_shard, default=(1, 1), metavar="K/N",
                        help="run every N-th shape starting at the K-th")
    parser.add_argument("--rounds", type=parse_rounds, default=ROUNDS,
                        help="interleaved timing rounds per block (their median counts)")
    parser.add_argument("--out", type=output_folder, default=Path("."),
                        help="folder for epilogue_bench.csv (written row by row)")


def main(args: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        print("bench epilogue needs an sm_90 GPU")
        return 2
    print(f"{'block':24s} {'M':>5} {'N':>6} {'K':>5} {'ours':>7} {'default':>8} "
          f"{'max-at':>7} {'/default':>9} {'/max-at':>8} {'rounds':>9} {'ceiling':>8} "
          f"{'fused':>6}   "
          "our configs (TFLOP/s)", flush=True)
    rows = []
    index, count = args.shard
    shapes = (args.shapes or (QUICK if args.quick else SHAPES))[index - 1::count]
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "epilogue_bench.csv", "w", newline="") as table:
        writer = csv.DictWriter(table, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for m, n, k in shapes:
            for name, block in blocks(m, n, k).items():
                row = measure(name, m, n, k, *block, rounds=args.rounds)
                rows.append(row)
                writer.writerow(row)
                table.flush()
                print(f"{name:24s} {m:>5} {n:>6} {k:>5} {row['ours']:7.0f} "
                      f"{row['default']:8.0f} {row['max_autotune']:7.0f} "
                      f"{row['vs_default']:9.2f} {row['vs_max_autotune']:8.2f} "
                      f"{row['vs_max_autotune_min']:4.2f}-{row['vs_max_autotune_max']:4.2f} "
                      f"{row['ceiling']:8.2f} "
                      f"{'yes' if row['fused'] else 'NO':>6}   {row['our_configs']}",
                      flush=True)
    print(summarize(rows))
    return 0


def summarize(rows: list[dict[str, Any]]) -> str:
    """Geomean and worst of ours / max-autotune, the blocks at the goal, and those whose
    fusion ceiling is below it."""
    ratios = [row["vs_max_autotune"] for row in rows]
    geomean = math.exp(sum(map(math.log, ratios)) / len(ratios))
    at_goal = sum(ratio >= GOAL for ratio in ratios)
    every_round = sum(row["vs_max_autotune_min"] >= GOAL for row in rows)
    capped = [row for row in rows if row["ceiling"] < GOAL]
    summary = (f"ours / Inductor max-autotune: geomean {geomean:.3f}, worst {min(ratios):.2f}; "
               f">= {GOAL} on {at_goal} of {len(rows)} blocks (in every round on {every_round})")
    if capped:
        summary += (f"\nfusion ceiling (max-autotune over the GEMMs alone by cuBLAS) below {GOAL} "
                    f"on {len(capped)}: " + ", ".join(
                        f"{row['block']} {row['m']}x{row['n']}x{row['k']} {row['ceiling']:.2f}"
                        for row in capped))
    return summary


def measure(name: str, m: int, n: int, k: int, fn: Any, gemms: Any,
            fn_args: tuple[torch.Tensor, ...], flops: int, rounds: int = ROUNDS) -> dict[str, Any]:
    """One table row: TFLOP/s of ours, Inductor default and max-autotune and of the
    block's GEMMs alone by cuBLAS (their CUDA graphs timed in ``rounds`` interleaved
    rounds), the ratios and their ranges, and the fusion ceiling."""
    graphs, fused, configs = {}, False, ""
    for variant in VARIANTS:
        out, all_fused, used = compiled(fn, fn_args, variant)
        graphs[variant] = captured(lambda: out(*fn_args))  # before the next reset
        if variant == "ours":
            fused, configs = all_fused, used
    graphs["gemm_alone"] = captured(lambda: gemms(*fn_args))
    times = interleaved_ms({variant: graph.replay for variant, graph in graphs.items()},
                           rounds)
    row = tflops_and_ratios(times, flops, ("default", "max_autotune"))
    return dict(block=name, m=m, n=n, k=k, fused=fused, our_configs=configs,
                ceiling=row["gemm_alone"] / row["max_autotune"], **row)
