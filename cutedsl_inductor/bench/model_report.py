"""``bench model``'s report: each row's ratios to max-autotune of its family and
workload, the line printed per row, the CSV, the summary of our speedups and first-call
ratios, and the plot of the speedups (ratios first, readable on a screen)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from .gemm_plot import pyplot


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Each row's speedup over max-autotune (and eager) of its family and workload, and
    its first calls over max-autotune's."""
    by = {(r["family"], r["workload"], r["variant"]): r for r in rows
          if r["variant"] in ("max-autotune", "eager")}
    for row in rows:
        for ref in ("max-autotune", "eager"):
            base = by.get((row["family"], row["workload"], ref))
            if base is not None:
                row[f"speedup_vs_{ref}"] = base["ms"] / row["ms"]
        base = by.get((row["family"], row["workload"], "max-autotune"))
        if base is not None and row["caches"] == "cold" and row["variant"] != "eager":
            row["first_call_vs_max_autotune"] = row["first_call_s"] / base["first_call_s"]
            if "first_call_warm_s" in row and "first_call_warm_s" in base:
                row["warm_first_call_vs_max_autotune"] = (row["first_call_warm_s"]
                                                          / base["first_call_warm_s"])


def settings(row: dict[str, Any]) -> str:
    """Our variants' fusion and PDL settings where the run set them, e.g. " fusion on"."""
    words = {None: "", True: " {} on", False: " {} off"}
    return (words[row["fusion"]].format("fusion")
            + words[row.get("pdl")].format("pdl"))


def line(row: dict[str, Any]) -> str:
    warm = f" / {row['first_call_warm_s']:.1f}" if "first_call_warm_s" in row else ""
    return (f"{row['family']:6} {row['workload']:13} {row['tokens']:>8} "
            f"{row['variant'] + settings(row):22} {row['ms']:9.3f} ms (host {row['host_ms']:.3f})"
            f"  first call "
            f"{row['first_call_s']:6.1f}{warm} s ({row['caches']})  CuTe kernels "
            f"{row['cute_kernels']}  rel err {row['rel_err']:.2e} (eager "
            f"{row['rel_err_eager']:.2e}) {'ok' if row['ok'] else 'WRONG'}")


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fields = list(dict.fromkeys(key for row in rows for key in row))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fields)
        writer.writeheader()
        writer.writerows(rows)


def summary(rows: list[dict[str, Any]]) -> str:
    """The speedups of our variant(s) over max-autotune and the first-call ratios."""
    lines = ["", "speedup over max-autotune (ms per step), first call cold / warm vs max-autotune:"]
    for row in rows:
        if not row["variant"].startswith("cutedsl") or "speedup_vs_max-autotune" not in row:
            continue
        first = ""
        if "first_call_vs_max_autotune" in row:
            first = f"   first call {row['first_call_vs_max_autotune']:.2f}x"
            if "warm_first_call_vs_max_autotune" in row:
                first += f" / {row['warm_first_call_vs_max_autotune']:.2f}x"
        lines.append(f"  {row['family']:6} {row['workload']:13} {row['variant']:17} "
                     f"{settings(row).strip() or 'defaults':10} "
                     f"{row['speedup_vs_max-autotune']:.3f}x{first}")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Bars of each compiled variant's speedup over max-autotune, per family and workload."""
    import torch

    plt = pyplot()
    if plt is None:
        return
    shown = [r for r in rows if r["variant"] in ("default", "cutedsl", "cutedsl-no-triton")
             and "speedup_vs_max-autotune" in r]
    if not shown:
        return
    labels = [f"{r['family']} {r['workload']} {r['variant']}{settings(r)}" for r in shown]
    values = [r["speedup_vs_max-autotune"] for r in shown]
    fig, ax = plt.subplots(figsize=(10, 0.4 * len(shown) + 1.5), dpi=100)
    ax.barh(labels, values, color=["tab:green" if v >= 1 else "tab:red" for v in values])
    ax.axvline(1.0, color="black", linewidth=1)
    for y, v in enumerate(values):
        ax.text(v, y, f" {v:.3f}x", va="center")
    ax.invert_yaxis()
    ax.set_xlabel("speedup over Inductor max-autotune (ATEN,TRITON), ms per step")
    ax.set_title(f"bench model on {torch.cuda.get_device_name()} (torch {torch.__version__})")
    fig.tight_layout()
    fig.savefig(path)
