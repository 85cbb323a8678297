"""``bench gemm --dtypes fp8 [--scales tensorwise,rowwise]``: our FP8 GEMM
(``Sm90ScaledGemm`` through ``_scaled_mm``'s choices) against ATen's ``torch._scaled_mm``
(cuBLAS tensorwise, CUTLASS rowwise) and Inductor's best Triton scaled-mm template, per
shape and scale recipe, measured in one run.

Operands as torchao's float8 Linear makes them (``quantize``): e4m3 values with their
dequantization scales (``_scaled_mm`` multiplies by them), tensorwise (one per operand)
or rowwise (one per row of A, one per column of B); A row-major, B the transposed (N, K)
weight (column-major, as ``_scaled_mm`` takes it); bf16 output, fast accumulation (the
kernel's, ``kernels/gemm/scaled.py``). Ours: the fastest of the heuristic's FP8 configs,
each checked against the dequantized operands' float64 product first. Then ours, ATen
and Triton in ``--rounds`` interleaved rounds as ``bench gemm``'s 16-bit rows; the CSV
(``gemm_fp8_bench.csv``: ``dtype`` fp8, a ``scales`` column, ratios ``vs_aten`` and
``vs_triton`` with their ranges over the rounds) gets each row as it is measured. No plot.
"""

from __future__ import annotations

import csv
import functools
import math
from pathlib import Path
from typing import Any

import torch

from ..autotune.scratch import scratch_graph
from ..autotune.timing import fastest_by_median, interleaved_ms
from .args import one_of
from .gemm_plot import geomean
from .timing import tflops_and_ratios

SCALES = ("tensorwise", "rowwise")
parse_scales = one_of(SCALES, "scale recipe")
FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max
TOLERANCE = 2e-2  # relative (Frobenius) error of a bf16 output against float64
PICK_ROUNDS = 3

FIELDS = ["m", "n", "k", "dtype", "scales", "config", "ours", "aten", "triton", "vs_aten",
          "vs_triton", "vs_aten_min", "vs_aten_max", "vs_triton_min", "vs_triton_max",
          "gpu", "torch", "cute_dsl"]


def quantize(x: torch.Tensor, recipe: str, dim: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` as e4m3 values and the fp32 scale that dequantizes them (``x ~ q * scale``):
    one scale (a 0-d tensor) for "tensorwise", one per slice along ``dim``'s other axis
    for "rowwise" (keepdim: (M, 1) of an (M, K) A; a weight's (N, 1), which ``_scaled_mm``
    takes transposed as B's (1, N))."""
    amax = (x.abs().amax() if recipe == "tensorwise"
            else x.abs().amax(dim=dim, keepdim=True)).float().clamp(min=1e-12)
    scale = amax / FP8_MAX
    return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def operands(m: int, n: int, k: int, recipe: str) -> tuple[torch.Tensor, ...]:
    """(a, b, scale_a, scale_b) for ``torch._scaled_mm``: b the (K, N) column-major view
    of an (N, K) weight, its rowwise scale (1, N)."""
    a, scale_a = quantize(torch.randn(m, k, device="cuda"), recipe)
    w, scale_w = quantize(torch.randn(n, k, device="cuda"), recipe)
    return a, w.t(), scale_a, scale_w.t()


def reference(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor,
              scale_b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The float64 product of the dequantized operands (plus the bias)."""
    out = (a.double() * scale_a.double()) @ (b.double() * scale_b.double())
    return out if bias is None else out + bias.double()


def aten(a, b, scale_a, scale_b):
    return torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.bfloat16,
                            use_fast_accum=True)


def ours_best(inputs: tuple[torch.Tensor, ...]) -> tuple[Any, str]:
    """The fastest of the heuristic's FP8 configs through the template (as Inductor runs
    it), each checked first (``gemm.checked_run``), then timed in interleaved rounds."""
    from torch._inductor import ir

    from ..kernels.gemm.scaled_choices import scaled_mm_choices  # imports cutlass
    from .gemm import checked_run  # gemm.py imports this module

    a, b = inputs[:2]
    m, n = a.shape[0], b.shape[1]
    with scratch_graph() as scratch:
        nodes = [scratch.input(t.shape, t.dtype, t.stride()) for t in inputs]
        layout = ir.FixedLayout(torch.device("cuda", 0), torch.bfloat16, [m, n])
        choices: list[Any] = []
        reason = scaled_mm_choices(choices, nodes, layout, use_fast_accum=True)
    if reason is not None:
        raise AssertionError(f"no FP8 choice at {m}x{n}x{a.shape[1]}: {reason}")
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    expected = reference(*inputs)
    calls = {}
    for choice in choices:
        try:
            run = checked_run(choice, inputs, out, expected)
            calls[choice.description] = functools.partial(run, *inputs, out)
        except Exception as err:  # a failing config is reported, the others go on
            print(f"  config failed: {choice.description}: {err}")
    if not calls:
        raise AssertionError(f"no FP8 config ran correctly at {m}x{n}x{a.shape[1]}")
    best, _ = fastest_by_median(calls, PICK_ROUNDS)
    return calls[best], best


def triton_compiled(inputs: tuple[torch.Tensor, ...]) -> Any:
    """``_scaled_mm`` compiled with Inductor's Triton templates only (max-autotune)."""
    torch._dynamo.reset()
    with torch._inductor.config.patch(max_autotune=True, max_autotune_gemm_backends="TRITON",
                                      fx_graph_cache=False):
        fn = torch.compile(aten)
        fn(*inputs)
    return lambda: fn(*inputs)


def measure_row(m: int, n: int, k: int, recipe: str, with_triton: bool, rounds: int,
                setup: dict[str, str]) -> dict[str, Any]:
    inputs = operands(m, n, k, recipe)
    ours, cfg = ours_best(inputs)
    fns = {"ours": ours, "aten": lambda: aten(*inputs)}
    if with_triton:
        fns["triton"] = triton_compiled(inputs)
    times = interleaved_ms(fns, rounds)
    times.setdefault("triton", [math.nan] * rounds)
    return dict(m=m, n=n, k=k, dtype="fp8", scales=recipe, config=cfg,
                **tflops_and_ratios(times, 2 * m * n * k, ("aten", "triton")), **setup)


HEADER = (f"{'M':>6} {'N':>7} {'K':>6} {'scales':>10} {'ours':>7} {'ATen':>7} {'Triton':>7} "
          f"{'/ATen':>8} {'/Triton':>8}  config")


def print_row(row: dict[str, Any]) -> None:
    print(f"{row['m']:>6} {row['n']:>7} {row['k']:>6} {row['scales']:>10} {row['ours']:7.0f} "
          f"{row['aten']:7.0f} {row['triton']:7.0f} {row['vs_aten']:8.3f} "
          f"{row['vs_triton']:8.3f}  {row['config'].removeprefix('CuteDSL sm90_gemm ')}",
          flush=True)


def summarize(rows: list[dict[str, Any]]) -> str:
    """The issue's goals per recipe: geomean over ATen and over Triton, the worst row."""
    lines = []
    for recipe in dict.fromkeys(r["scales"] for r in rows):
        own = [r for r in rows if r["scales"] == recipe]
        worst = min(own, key=lambda r: r["vs_aten"])
        line = (f"{recipe}: geomean vs ATen {geomean([r['vs_aten'] for r in own]):.3f} over "
                f"{len(own)} shapes, worst {worst['vs_aten']:.2f} at "
                f"{worst['m']}x{worst['n']}x{worst['k']}")
        triton = [r["vs_triton"] for r in own if not math.isnan(r["vs_triton"])]
        if triton:
            line += f"; geomean vs Triton {geomean(triton):.3f}"
        lines.append(line)
    return "\n".join(lines)


def run_suite(shapes: list[tuple[int, int, int]], recipes: list[str], with_triton: bool,
              rounds: int, out: Path, setup: dict[str, str]) -> list[dict[str, Any]]:
    """Every shape x recipe into ``out``/gemm_fp8_bench.csv, a row at a time; prints the
    table and the summary."""
    rows = []
    with open(out / "gemm_fp8_bench.csv", "w", newline="") as table:
        writer = csv.DictWriter(table, fieldnames=FIELDS)
        writer.writeheader()
        print(HEADER, flush=True)
        for m, n, k in shapes:
            for recipe in recipes:
                row = measure_row(m, n, k, recipe, with_triton, rounds, setup)
                rows.append(row)
                writer.writerow(row)
                table.flush()
                print_row(row)
    print(summarize(rows))
    return rows
