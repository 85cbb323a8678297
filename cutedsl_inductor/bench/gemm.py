"""``python -m cutedsl_inductor bench gemm``: our Hopper GEMM against cuBLAS and
Inductor's best Triton template, per shape, measured in one run.

Suite: squares 1024..8192 and LLM shapes M in {16, 64, 128, 256, 1024, 4096, 8192} x
(N, K) in {(4096, 4096), (14336, 4096), (4096, 14336), (128256, 4096)}; bf16 and fp16;
B given as ``w.T`` (an nn.Linear weight, "nt") or as a row-major (K, N) matrix ("nn").
``--quick`` runs a small representative subset, ``--shapes MxNxK,...`` the shapes
given; ``--shard K/N`` splits the suite across several runs (each writes its own CSV).
For each shape: TFLOP/s of our best config (the heuristic's configs, each compiled
through the template path and timed), of ``torch.mm`` (cuBLAS) and of Inductor's best
Triton template (``max_autotune_gemm_backends="TRITON"``), with the ratios; the CSV in
``--out`` gets each row as it is measured (a run cut short keeps what it measured), the
PNG plot comes at the end. Timing: our configs are timed in interleaved rounds to pick
the fastest (each checked against float64 first); then that config, cuBLAS and Triton are
timed in ``--rounds`` interleaved rounds (``timing.interleaved_ms``: ``do_bench``
medians, L2 flushed, fresh random inputs), the median round counting and the ratios'
range over the rounds printed and kept in the CSV (``vs_*_min``/``vs_*_max``).
``--merge DIR|CSV ...`` prints the table and summary of shards run earlier (their CSVs) and
writes them as one CSV and plot. ``--dtypes fp8`` (``--scales tensorwise,rowwise``) runs
the FP8 GEMM's rows against ``torch._scaled_mm`` (``gemm_fp8.py``; B as "nt" only, its
own CSV, no plot or merge).
"""

from __future__ import annotations

import argparse
import csv
import functools
import math
from pathlib import Path
from typing import Any

import torch

from ..autotune.scratch import scratch_graph
from ..autotune.timing import fastest_by_median, interleaved_ms
from ..compile import versions
from .args import (
    csv_rows,
    one_of,
    output_folder,
    parse_layouts,
    parse_rounds,
    parse_shapes,
    parse_shard,
    read_csv_rows,
)
from .gemm_fp8 import SCALES, parse_scales
from .gemm_fp8 import run_suite as run_fp8_suite
from .gemm_plot import geomean, write_plot
from .timing import tflops_and_ratios

SQUARES = [(s, s, s) for s in (1024, 2048, 4096, 8192)]
LLM_NK = [(4096, 4096), (14336, 4096), (4096, 14336), (128256, 4096)]
LLM = [(m, n, k) for m in (16, 64, 128, 256, 1024, 4096, 8192) for n, k in LLM_NK]
QUICK = [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 14336, 4096), (128, 8192, 8192),
         (16, 4096, 4096), (1024, 14336, 4096)]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
parse_dtypes = one_of((*DTYPES, "fp8"), "dtype")


def operands(m: int, n: int, k: int, dtype: torch.dtype, layout: str) -> tuple[Any, Any]:
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    if layout == "nt":
        b = torch.randn(n, k, device="cuda", dtype=dtype).t()
    else:
        b = torch.randn(k, n, device="cuda", dtype=dtype)
    return a, b


TOLERANCE = 2e-2  # relative (Frobenius) error of a 16-bit GEMM against float64
PICK_ROUNDS = 3  # interleaved rounds that pick our fastest config


def checked_run(choice: Any, inputs: tuple, out: torch.Tensor, reference: torch.Tensor) -> Any:
    """``choice``'s kernel entry, after one call on ``inputs`` into ``out`` (NaN-filled
    first) matched ``reference`` within ``TOLERANCE`` (AssertionError otherwise)."""
    run = choice.load().run
    out.fill_(math.nan)
    run(*inputs, out)
    error = ((out.double() - reference).norm() / reference.norm()).item()
    if not error < TOLERANCE:
        raise AssertionError(f"wrong result (relative error {error:.2e})")
    return run


def ours_best(a: torch.Tensor, b: torch.Tensor) -> tuple[Any, str]:
    """The fastest of the heuristic's configs, through the template (as Inductor runs it):
    a function computing ``a @ b`` with it, and its description.  Every config's result
    is checked against float64 first; the configs are then timed in ``PICK_ROUNDS``
    interleaved rounds, the median round counting (timed one after another, the first
    would run at the clock an idle GPU boosts to)."""
    from torch._inductor import ir

    # lazily: the kernel's modules import cutlass, which `bench --help` need not load
    from ..kernels.gemm.template import gemm_choices

    m, n = a.shape[0], b.shape[1]
    with scratch_graph() as scratch:
        nodes = [scratch.input(a.shape, a.dtype, a.stride()),
                 scratch.input(b.shape, b.dtype, b.stride())]
        layout = ir.FixedLayout(torch.device("cuda", 0), a.dtype, [m, n])
        choices: list[Any] = []
        gemm_choices(choices, "mm", nodes, layout)
    out = torch.empty(m, n, device="cuda", dtype=a.dtype)
    reference = a.double() @ b.double()
    calls = {}
    for choice in choices:
        try:
            calls[choice.description] = functools.partial(
                checked_run(choice, (a, b), out, reference), a, b, out)
        except Exception as err:  # a failing config is reported, the others go on
            print(f"  config failed: {choice.description}: {err}")
    if not calls:
        raise AssertionError(f"no config ran correctly at {m}x{n}x{a.shape[1]}")
    best, _ = fastest_by_median(calls, PICK_ROUNDS)
    return calls[best], best


def triton_compiled(a: torch.Tensor, b: torch.Tensor) -> Any:
    """``torch.mm`` compiled with Inductor's Triton templates only (max-autotune)."""
    torch._dynamo.reset()
    with torch._inductor.config.patch(max_autotune=True, max_autotune_gemm_backends="TRITON",
                                      fx_graph_cache=False):
        fn = torch.compile(torch.mm)
        fn(a, b)
    return lambda: fn(a, b)


def _ratio_range(row: dict[str, Any], ref: str) -> str:
    low, high = row.get(f"vs_{ref}_min"), row.get(f"vs_{ref}_max")
    if low is None or math.isnan(low):  # a row of a CSV from before the rounds
        return " " * 9
    return f"{low:4.2f}-{high:4.2f}"


def print_row(row: dict[str, Any]) -> None:
    print(f"{row['m']:>6} {row['n']:>7} {row['k']:>6} {row['dtype']:>4} {row['layout']:>3} "
          f"{row['ours']:7.0f} {row['cublas']:7.0f} {row['triton']:7.0f} "
          f"{row['vs_cublas']:8.3f} {_ratio_range(row, 'cublas')} "
          f"{row['vs_triton']:8.3f} {_ratio_range(row, 'triton')}  "
          f"{row['config'].removeprefix('CuteDSL sm90_gemm ')}", flush=True)


HEADER = (f"{'M':>6} {'N':>7} {'K':>6} {'dt':>4} {'B':>3} {'ours':>7} {'cuBLAS':>7} "
          f"{'Triton':>7} {'/cuBLAS':>8} {'rounds':>9} {'/Triton':>8} {'rounds':>9}  config")


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a ``bench gemm`` CSV (``path``, or ``path``/gemm_bench.csv); ValueError
    where it is not one."""
    return read_csv_rows(path, "gemm_bench.csv", BASE_FIELDS, lambda key, text: (
        text if key in TEXT_FIELDS else int(text) if key in "mnk" else float(text or "nan")))


# ``--merge``: a shard's folder (its gemm_bench.csv) or a CSV file, read
parse_shard_rows = csv_rows(read_rows, "bench gemm")


# a CSV of any version has these; the ratios' ranges over the rounds came later, and then
# the setup each row was measured on (GPU, versions)
BASE_FIELDS = ["m", "n", "k", "dtype", "layout", "config", "ours", "cublas", "triton",
               "vs_cublas", "vs_triton"]
SETUP_FIELDS = ["gpu", "torch", "cute_dsl"]
CSV_FIELDS = BASE_FIELDS + ["vs_cublas_min", "vs_cublas_max", "vs_triton_min",
                            "vs_triton_max"] + SETUP_FIELDS
TEXT_FIELDS = ("dtype", "layout", "config", *SETUP_FIELDS)
ROUNDS = 5


def setup() -> dict[str, str]:
    """The GPU and versions measured on (the CSV's setup columns)."""
    return dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                cute_dsl=versions.toolchain_versions()["nvidia-cutlass-dsl"])


def measure_row(m: int, n: int, k: int, dt: str, layout: str, with_triton: bool,
                rounds: int = ROUNDS) -> dict[str, Any]:
    """One shape: our best config, cuBLAS and Triton timed in ``rounds`` interleaved
    rounds (``interleaved_ms``); TFLOP/s from the medians, the ratios' range over the
    rounds in the ``_min``/``_max`` fields."""
    a, b = operands(m, n, k, DTYPES[dt], layout)
    ours, cfg = ours_best(a, b)
    fns = {"ours": ours, "cublas": lambda: torch.mm(a, b)}
    if with_triton:
        fns["triton"] = triton_compiled(a, b)
    times = interleaved_ms(fns, rounds)
    times.setdefault("triton", [math.nan] * rounds)
    return dict(m=m, n=n, k=k, dtype=dt, layout=layout, config=cfg,
                **tflops_and_ratios(times, 2 * m * n * k, ("cublas", "triton")), **setup())


def run_suite(shapes: list[tuple[int, int, int]], dtypes: list[str], layouts: list[str],
              with_triton: bool, table: Any, rounds: int = ROUNDS) -> list[dict[str, Any]]:
    """Measure every shape x dtype x layout; each row goes to ``table`` (a file) at once."""
    rows = []
    writer = csv.DictWriter(table, fieldnames=CSV_FIELDS)
    writer.writeheader()
    print(HEADER, flush=True)
    for m, n, k in shapes:
        for dt in dtypes:
            for layout in layouts:
                row = measure_row(m, n, k, dt, layout, with_triton, rounds)
                rows.append(row)
                writer.writerow(row)
                table.flush()
                print_row(row)
    return rows


def summarize(rows: list[dict[str, Any]]) -> str:
    ratios = [r["vs_cublas"] for r in rows if r["vs_cublas"] > 0]
    worst = min(rows, key=lambda r: r["vs_cublas"])
    lines = [f"geomean vs cuBLAS {geomean(ratios):.3f} over {len(rows)} shapes; worst "
             f"{worst['vs_cublas']:.2f} at {worst['m']}x{worst['n']}x{worst['k']} "
             f"{worst['dtype']} {worst['layout']}"]
    with_triton = [r for r in rows if not math.isnan(r["vs_triton"])]
    if with_triton:
        above = sum(r["vs_triton"] > 1 for r in with_triton)
        lines.append(f"above Inductor's best Triton on {above} of {len(with_triton)} shapes")
        in_rounds = [r for r in with_triton if not math.isnan(r.get("vs_triton_min", math.nan))]
        if in_rounds:
            every_round = sum(r["vs_triton_min"] > 1 for r in in_rounds)
            lines.append(f"in every round on {every_round} of the {len(in_rounds)} timed "
                         "in rounds")
    return "\n".join(lines)


def write_csv(rows: list[dict[str, Any]], out: Path) -> None:
    with open(out / "gemm_bench.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(rows)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="a small representative subset")
    parser.add_argument("--shapes", type=parse_shapes, metavar="MxNxK,...",
                        help="these shapes instead of the suite")
    parser.add_argument("--dtypes", type=parse_dtypes, default=list(DTYPES),
                        metavar="bf16,fp16,fp8")
    parser.add_argument("--scales", type=parse_scales, default=list(SCALES),
                        metavar="tensorwise,rowwise", help="the fp8 rows' scale recipes")
    parser.add_argument("--layouts", type=parse_layouts, default=["nt", "nn"], metavar="nt,nn",
                        help="B as w.T (nt) or row-major (nn)")
    parser.add_argument("--no-triton", action="store_true")
    parser.add_argument("--rounds", type=parse_rounds, default=ROUNDS,
                        help="interleaved timing rounds per shape (their median counts)")
    parser.add_argument("--shard", type=parse_shard, default=(1, 1), metavar="K/N",
                        help="run every N-th shape starting at the K-th (split long suites)")
    parser.add_argument("--out", type=output_folder, default=Path("bench-out"),
                        help="folder for gemm_bench.csv and gemm_bench.png")
    parser.add_argument("--merge", type=parse_shard_rows, nargs="+", metavar="DIR|CSV",
                        help="summarize shards run earlier (their folders or CSV files)")


def main(args: argparse.Namespace) -> int:
    if args.merge:
        rows = [row for shard in args.merge for row in shard]
        args.out.mkdir(parents=True, exist_ok=True)
        print(HEADER)
        for row in rows:
            print_row(row)
        print(summarize(rows))
        write_csv(rows, args.out)
        write_plot(rows, args.out / "gemm_bench.png")
        return 0
    if not torch.cuda.is_available():
        print("bench gemm needs an sm_90 GPU")
        return 2
    index, count = args.shard
    shapes = (args.shapes or (QUICK if args.quick else SQUARES + LLM))[index - 1::count]
    args.out.mkdir(parents=True, exist_ok=True)
    dtypes = [dt for dt in args.dtypes if dt in DTYPES]
    if "fp8" in args.dtypes:
        run_fp8_suite(shapes, args.scales, not args.no_triton, args.rounds, args.out, setup())
    if not dtypes:
        return 0
    with open(args.out / "gemm_bench.csv", "w", newline="") as table:
        rows = run_suite(shapes, dtypes, args.layouts, with_triton=not args.no_triton,
                         table=table, rounds=args.rounds)
    print(summarize(rows))
    write_plot(rows, args.out / "gemm_bench.png")
    return 0
