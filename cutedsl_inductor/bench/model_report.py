"""``bench model``'s report: the line printed per row, the CSV, the table of speedups
over max-autotune (each the median of the per-round ratios, its range beside it) and of
first calls, and the plot of the speedups with their ranges (readable on a screen).
Files are named after the GPU: ``model_bench_h100.csv``. ``agreement`` compares the
speedups of two runs of the same command (``python -m cutedsl_inductor.bench.model_report
A.csv B.csv``, as ``benchmarks/model_gpu.sh`` runs it)."""

from __future__ import annotations

import csv
import re
import sys
from pathlib import Path
from typing import Any

from .gemm_plot import pyplot
from .model_variants import LEVERS, settings

REFERENCE = "max-autotune"


def case(row: dict[str, Any]) -> str:
    """``"llama decode 8x1024+32 graphs"``."""
    return (f"{row['family']} {row['workload']} {row['tokens']}"
            + (" graphs" if row["graphs"] else ""))


def label(row: dict[str, Any]) -> str:
    return f"{case(row)} {row['variant']}{settings(row)}"


def _speedup(row: dict[str, Any], ref: str = REFERENCE) -> str:
    key = f"speedup_vs_{ref}"
    if key not in row:
        return ""
    return f"{row[key]:.3f}x [{row[key + '_min']:.3f}-{row[key + '_max']:.3f}]"


def line(row: dict[str, Any]) -> str:
    unit = "token" if row["workload"] == "decode" else "step"
    first = ""
    if "first_call_s" in row:
        warm = f" / {row['first_call_warm_s']:.1f}" if "first_call_warm_s" in row else ""
        first = f"  first call {row['first_call_s']:.1f}{warm} s ({row['caches']})"
    speedup = _speedup(row)
    return (f"{row['family']:7} {row['workload']:8} {row['tokens']:>10} "
            f"{'graphs' if row['graphs'] else '':6} {row['variant'] + settings(row):24} "
            f"{row['ms']:9.3f} ms/{unit} (host {row['host_ms']:.3f}) "
            f"{row['tokens_per_s']:9.0f} tok/s"
            + (f"  {speedup}" if speedup else "")
            + f"  CuTe kernels {row['cute_kernels']}  rel err {row['rel_err']:.2e} (eager "
            f"{row['rel_err_eager']:.2e}) {'ok' if row['ok'] else 'WRONG'}"
            + (f"  graph skips {row['graph_skips']}" if row["graph_skips"] else "") + first)


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fields = list(dict.fromkeys(key for row in rows for key in row))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fields)
        writer.writeheader()
        writer.writerows(rows)


def file_stem(rows: list[dict[str, Any]]) -> str:
    """``model_bench_<gpu>``: the GPU's model number (``NVIDIA H100 80GB HBM3``: h100)."""
    gpu = rows[0].get("gpu", "gpu")
    model = re.search(r"\b[A-Za-z]+\d{2,4}[A-Za-z]?\b", gpu.replace("NVIDIA", ""))
    return "model_bench_" + (model.group(0) if model else re.sub(r"\W+", "_", gpu)).lower()


def add_first_call_ratios(rows: list[dict[str, Any]]) -> None:
    """Each cold first call over max-autotune's of its family and workload (and warm)."""
    base = {(r["family"], r["workload"]): r for r in rows
            if r["variant"] == REFERENCE and "first_call_s" in r}
    for row in rows:
        ref = base.get((row["family"], row["workload"]))
        if ref is None or row.get("caches") != "cold" or row is ref:
            continue
        row["first_call_vs_max_autotune"] = row["first_call_s"] / ref["first_call_s"]
        if "first_call_warm_s" in row and "first_call_warm_s" in ref:
            row["warm_first_call_vs_max_autotune"] = (row["first_call_warm_s"]
                                                      / ref["first_call_warm_s"])


def summary(rows: list[dict[str, Any]]) -> str:
    """The table: per case, max-autotune's ms and each other variant's speedup over it
    (median round ratio [min-max]), tokens per second, and first calls where measured."""
    lines = ["", f"speedup over {REFERENCE} in the same rounds, median [min-max] of the "
             "per-round ratios; ms per step (decode: per token); first call cold / warm "
             f"vs {REFERENCE}:",
             f"  {'case':34} {'variant':26} {'ms':>9} {'tok/s':>9} {'speedup':>24}  ok"]
    for row in rows:
        first = ""
        if "first_call_vs_max_autotune" in row:
            first = f"  first call {row['first_call_vs_max_autotune']:.2f}x"
            if "warm_first_call_vs_max_autotune" in row:
                first += f" / {row['warm_first_call_vs_max_autotune']:.2f}x"
        lines.append(f"  {case(row):34} {row['variant'] + settings(row):26} {row['ms']:9.3f} "
                     f"{row['tokens_per_s']:9.0f} {_speedup(row) or '-':>24}  "
                     f"{'ok' if row['ok'] else 'WRONG'}{first}")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Bars of each variant's speedup over max-autotune with its range over the rounds."""
    plt = pyplot()
    if plt is None:
        return
    shown = [r for r in rows if f"speedup_vs_{REFERENCE}" in r and r["variant"] != "eager"]
    if not shown:
        return
    values = [r[f"speedup_vs_{REFERENCE}"] for r in shown]
    errors = [[v - r[f"speedup_vs_{REFERENCE}_min"] for v, r in zip(values, shown)],
              [r[f"speedup_vs_{REFERENCE}_max"] - v for v, r in zip(values, shown)]]
    fig, ax = plt.subplots(figsize=(11, 0.4 * len(shown) + 1.5), dpi=100)
    ax.barh([label(r) for r in shown], values, xerr=errors, capsize=3,
            color=["tab:green" if v >= 1 else "tab:red" for v in values])
    ax.axvline(1.0, color="black", linewidth=1)
    for y, v in enumerate(values):
        ax.text(v, y, f" {v:.3f}x", va="center")
    ax.invert_yaxis()
    ax.set_xlabel(f"speedup over Inductor {REFERENCE} (ATEN,TRITON): median of the per-round "
                  "ratios, bars over their range")
    ax.set_title(f"bench model on {shown[0].get('gpu', '?')} (torch {shown[0].get('torch', '?')}"
                 f", {shown[0]['layers']} layers)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def agreement(first: list[dict[str, Any]], second: list[dict[str, Any]],
              tolerance: float = 0.02) -> tuple[str, bool]:
    """Each speedup over max-autotune that both runs measured, side by side (rows as
    ``csv.DictReader`` reads them), and whether all agree within ``tolerance`` (relative)."""
    key = f"speedup_vs_{REFERENCE}"
    before = {label(_typed(r)): float(r[key]) for r in first if r.get(key)}
    lines, worst = [f"  {'row':60} {'run 1':>8} {'run 2':>8} {'diff':>7}"], 0.0
    for row in second:
        name = label(_typed(row))
        if not row.get(key) or name not in before:
            continue
        diff = float(row[key]) / before[name] - 1
        worst = max(worst, abs(diff))
        lines.append(f"  {name:60} {before[name]:8.3f} {float(row[key]):8.3f} {diff:+7.1%}")
    agree = len(lines) > 1 and worst <= tolerance
    lines.append(f"  {len(lines) - 1} speedups, largest difference {worst:.1%}: "
                 + ("within" if agree else "NOT within") + f" {tolerance:.0%}")
    return "\n".join(lines), agree


def _typed(row: dict[str, Any]) -> dict[str, Any]:
    """A row read back from the CSV with its settings and graphs as ``label`` takes them."""
    values = {"": None, "True": True, "False": False}
    return {**row, "graphs": row["graphs"] == "True",
            **{lever: values[row.get(lever, "")] for lever in LEVERS}}


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m cutedsl_inductor.bench.model_report A.csv B.csv")
    tables = []
    for name in sys.argv[1:]:
        with open(name, newline="") as f:
            tables.append(list(csv.DictReader(f)))
    text, agree = agreement(*tables)
    print(text)
    sys.exit(0 if agree else 1)
