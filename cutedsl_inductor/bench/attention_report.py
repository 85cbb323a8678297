"""``bench attention``'s rows as text, CSV and plot.

A row is one variant of one case in one direction (``attention.py``): the case's fields,
``variant``, ``kernel`` (what ran the timed pass), ``ms``, ``tflops``, ``max_diff``,
``ok``, ``error`` (why the variant has no figures, else empty), the setup and, on ours'
and sdpa-choice's rows, ``vs_<ref>`` with its range over the rounds. Everything here
works from the rows alone, so ``bench attention --merge CSV ...`` redraws runs made
earlier.

The plot: ratios first -- ours over Inductor's Triton flex and flex's FLASH backend (the
goals over Triton, 1.5 forward and 1.3 backward, drawn), ours over SDPA on plain causal --
then each variant's TFLOP/s forward and backward; one x position per case, titled with
the GPU and versions.
"""

from __future__ import annotations

import collections
import csv
import math
from pathlib import Path
from typing import Any

from .args import csv_rows, read_csv_rows
from .gemm_plot import MARKERS, geomean, pyplot, range_bars, ratio_axis, setup_line

CASE_FIELDS = ["batch", "heads", "seq", "head_dim", "mask", "dtype"]
REFS = ("triton", "triton-tuned", "flash", "sdpa-flash", "sdpa-cudnn")  # ours compared with
# the printed table's ratio columns: over Triton flex, flex's FLASH backend, SDPA's two
COLUMNS = {"triton": "/triton", "flash": "/fa4", "sdpa-flash": "/fa2", "sdpa-cudnn": "/cudnn"}
RATIO_FIELDS = [f"vs_{ref}{end}" for ref in REFS for end in ("", "_min", "_max")]
FIELDS = (CASE_FIELDS + ["direction", "variant", "kernel", "density", "ms", "tflops"]
          + RATIO_FIELDS + ["max_diff", "ok", "error", "gpu", "torch", "cute_dsl"])
TEXT_FIELDS = ("mask", "dtype", "direction", "variant", "kernel", "error", "gpu", "torch",
               "cute_dsl")
GOALS = {"fwd": 1.5, "bwd": 1.3}  # ours over Triton flex (issue #38)


def case_name(row: dict[str, Any]) -> str:
    return f"{row['batch']}x{row['heads']}x{row['seq']} d{row['head_dim']} {row['mask']}"


HEADER = (f"{'case':<28} {'dt':>4} {'dir':>3} {'variant':<12} {'kernel':<8} {'ms':>9} "
          f"{'TFLOP/s':>7} " + " ".join(f"{c:>7}" for c in COLUMNS.values()) + f" {'max diff':>8}")


def line(row: dict[str, Any]) -> str:
    """One row as a line of the printed table (a failed variant: its reason)."""
    head = f"{case_name(row):<28} {row['dtype']:>4} {row['direction']:>3} {row['variant']:<12} "
    if row["error"]:
        return head + f"FAILED: {row['error']}"
    ratios = " ".join(f"{row.get(f'vs_{ref}', math.nan):7.3f}"
                      for ref in COLUMNS)
    flag = "" if row["ok"] else "  NOT OK (differs from triton's)"
    return (head + f"{row['kernel']:<8} {row['ms']:9.3f} {row['tflops']:7.1f} "
            f"{ratios.replace('nan', '  -')} {row['max_diff']:8.2e}{flag}")


def summary(rows: list[dict[str, Any]]) -> str:
    """Per direction: ours' geomean, worst and goal count over Triton flex, over SDPA;
    then the failed and not-ok rows."""
    lines = []
    for direction, goal in GOALS.items():
        ours = [r for r in rows if r["direction"] == direction and r["variant"] == "ours"]
        for ref, want in (("triton", goal), ("flash", 1.0), ("sdpa-flash", 1.0),
                          ("sdpa-cudnn", 1.0)):
            mine = [r for r in ours if not math.isnan(r.get(f"vs_{ref}", math.nan))]
            if not mine:
                continue
            worst = min(mine, key=lambda r: r[f"vs_{ref}"])
            met = sum(r[f"vs_{ref}"] >= want for r in mine)
            lines.append(f"{direction} ours / {ref}: geomean "
                         f"{geomean([r[f'vs_{ref}'] for r in mine]):.3f} over {len(mine)} "
                         f"cases, >= {want} on {met}; worst {worst[f'vs_{ref}']:.3f} at "
                         f"{case_name(worst)} {worst['dtype']}")
    backward = collections.Counter(r["kernel"] for r in rows if r["direction"] == "bwd"
                                   and r["variant"] == "ours" and not r["error"])
    if backward:
        lines.append("ours' backward ran on " + ", ".join(
            f"{kernel} ({count} cases)" for kernel, count in backward.items())
            + ("" if "cutedsl" in backward else ": no CuteDSL backward was offered"))
    failed = [r for r in rows if r["error"] or not r["ok"]]
    lines.append(f"{len(failed)} of {len(rows)} rows failed or differ from triton's"
                 + "".join(f"\n  {line(r)}" for r in failed))
    return "\n".join(lines)


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS, restval="", extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def write_profile(rows: list[dict[str, Any]], path: Path) -> None:
    """The profiled rows' kernels (``kernel_profile.KernelTime``), a line each."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(CASE_FIELDS + ["direction", "variant", "kernel_name", "ms",
                                       "launches"])
        for row in rows:
            for kernel in row.get("kernels", []):
                writer.writerow([row[key] for key in CASE_FIELDS + ["direction", "variant"]]
                                + [kernel.name, kernel.ms, kernel.launches])


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a ``bench attention`` CSV (``path``, or ``path``/attention_bench.csv);
    ValueError where it is not one."""
    return read_csv_rows(path, "attention_bench.csv", FIELDS, lambda key, text: (
        text if key in TEXT_FIELDS else text == "True" if key == "ok" else
        int(text) if key in CASE_FIELDS else float(text or "nan")))


# ``--merge``: a run's folder (its attention_bench.csv) or a CSV file, read
parse_csv_rows = csv_rows(read_rows, "bench attention")


def _series(ax: Any, rows: list[dict[str, Any]], cases: list[str], key: str,
            groups: list[tuple[str, ...]], group_of: Any) -> None:
    """``key`` of ``rows`` (bars: ``key``_min/_max where present), a series per group."""
    for i, group in enumerate(groups):
        mine = [r for r in rows if group_of(r) == group and not math.isnan(r[key])]
        offset = (i - (len(groups) - 1) / 2) * 0.8 / len(groups)
        ax.errorbar([cases.index(case_name(r)) + offset for r in mine], [r[key] for r in mine],
                    yerr=range_bars(mine, key), fmt=MARKERS[i % len(MARKERS)], markersize=4,
                    elinewidth=0.8, label=" ".join(group))
    ax.set_xticks(range(len(cases)), cases, rotation=55, ha="right", rotation_mode="anchor",
                  fontsize=7)
    ax.set_xlim(-0.6, len(cases) - 0.4)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="best")


def _ratio_panel(ax: Any, ours: list[dict[str, Any]], refs: tuple[str, ...], title: str) -> None:
    rows = [dict(r, ratio=r[f"vs_{ref}"], ratio_min=r[f"vs_{ref}_min"],
                 ratio_max=r[f"vs_{ref}_max"], ref=ref)
            for r in ours for ref in refs if not math.isnan(r.get(f"vs_{ref}", math.nan))]
    if not rows:
        ax.set_axis_off()
        ax.set_title(f"{title}: no ratios", fontsize=9, loc="left")
        return
    cases = list(dict.fromkeys(case_name(r) for r in rows))
    groups = list(dict.fromkeys((r["ref"], r["direction"], r["dtype"]) for r in rows))
    _series(ax, rows, cases, "ratio", groups, lambda r: (r["ref"], r["direction"], r["dtype"]))
    ratio_axis(ax, [v for r in rows for v in (r["ratio"], r["ratio_min"], r["ratio_max"])]
               + ([max(GOALS.values()) * 1.05] if "triton" in refs else []))
    if "triton" in refs:
        for direction, goal in GOALS.items():
            ax.axhline(goal, color="tab:red", linestyle="--" if direction == "fwd" else ":",
                       linewidth=0.8)
    ax.set_ylabel("ours / reference")
    means = {}
    for r in rows:
        means.setdefault(f"{r['ref']} {r['direction']}", []).append(r["ratio"])
    ax.set_title(f"{title}\ngeomeans: " + ", ".join(
        f"{name} {geomean(ratios):.3f}" for name, ratios in means.items()), fontsize=9, loc="left")


def write_plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Draw ``rows`` into ``path``: a PNG of at most 1600 x 1000 px."""
    plt = pyplot()
    if plt is None:
        return
    timed = [r for r in rows if not r["error"]]
    ours = [r for r in timed if r["variant"] == "ours"]
    fig, axes = plt.subplots(2, 2, figsize=(16, 10), squeeze=False)
    _ratio_panel(axes[0, 0], ours, ("triton", "triton-tuned", "flash"),
                 "ours / Inductor's Triton flex and flex's FLASH backend (red: the goals over "
                 "Triton, -- fwd 1.5, .. bwd 1.3)")
    _ratio_panel(axes[0, 1], ours, ("sdpa-flash", "sdpa-cudnn"), "ours / SDPA, plain causal")
    for ax, direction in zip(axes[1], GOALS):
        mine = [r for r in timed if r["direction"] == direction]
        cases = list(dict.fromkeys(case_name(r) for r in mine))
        groups = list(dict.fromkeys((r["variant"], r["dtype"]) for r in mine))
        if not mine:
            ax.set_axis_off()
            continue
        _series(ax, mine, cases, "tflops", groups, lambda r: (r["variant"], r["dtype"]))
        ax.set_ylim(bottom=0)
        ax.set_ylabel("TFLOP/s")
        ax.set_title(f"{direction}: TFLOP/s per variant", fontsize=9, loc="left")
    fig.suptitle("bench attention: FlexAttention, ours against Inductor's Triton flex and "
                 f"SDPA (ratios > 1: ours faster)\n{setup_line(rows)}", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=100)
    plt.close(fig)
