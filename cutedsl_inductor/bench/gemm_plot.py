"""``bench gemm``'s plot: per shape, our TFLOP/s over cuBLAS's and over Inductor's best
Triton template's, one marker per dtype and layout of B (its bar: the ratio's range over
the timing rounds), titled with the GPU and versions that the rows were measured on.

Drawn from the rows alone, so that ``bench gemm --merge CSV`` redraws it from a CSV.
Ratios, not TFLOP/s: rates spread over two orders of magnitude across the suite and hide
the comparison; a log scale keeps 0.9 and 1.1 as far from 1 as they are wrong.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

REFERENCES = (("cublas", "cuBLAS"), ("triton", "Inductor's best Triton"))
MARKERS = "osD^v<>p"
TICKS = (0.5, 0.67, 0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.25, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0)


def geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def setup_line(rows: list[dict[str, Any]]) -> str:
    """The GPUs and versions of ``rows`` (CSVs from before the setup columns: unknown)."""
    setups = dict.fromkeys(f"{r['gpu']}, torch {r['torch']}, CuTe DSL {r['cute_dsl']}"
                           for r in rows if r.get("gpu"))
    return "; ".join(setups) if setups else "GPU and versions not recorded"


def _ticks(low: float, high: float) -> list[float]:
    """Of ``TICKS`` within [low, high]: 1, and from there outwards each a tenth of the
    (log) range from the last one kept."""
    gap = math.log(high / low) / 10
    kept = [1.0]
    for side in (sorted(t for t in TICKS if 1.0 < t <= high),
                 sorted((t for t in TICKS if low <= t < 1.0), reverse=True)):
        last = 1.0
        for tick in side:
            if abs(math.log(tick / last)) >= gap:
                kept.append(tick)
                last = tick
    return sorted(kept)


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend, or None (said on stdout) without
    matplotlib, which is optional (the bench extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib not installed: no plot)")
        return None
    return plt


def ratio_axis(ax: Any, values: list[float]) -> None:
    """A log y axis of ratios spanning ``values`` (NaN ignored) and 0.95-1.05, its ticks
    ``_ticks``' and a line at 1."""
    import matplotlib.ticker as ticker

    values = [v for v in values if not math.isnan(v)]
    low, high = min(values + [0.95]) / 1.03, max(values + [1.05]) * 1.03
    ax.set_yscale("log")
    ax.set_ylim(low, high)
    ax.yaxis.set_major_locator(ticker.FixedLocator(_ticks(low, high)))
    ax.yaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
    ax.yaxis.set_minor_locator(ticker.NullLocator())
    ax.axhline(1.0, color="0.3", linewidth=0.8)


def range_bars(rows: list[dict[str, Any]], key: str) -> list[list[float]]:
    """matplotlib's ``yerr`` for ``key`` of ``rows``: the distances down to ``key``_min and
    up to ``key``_max, 0 where a bound is missing or NaN, never negative (a ratio of
    medians may lie a rounding outside the range of the rounds' ratios)."""
    def gap(a: float, b: float) -> float:
        return 0.0 if math.isnan(a - b) else max(0.0, a - b)
    return [[gap(r[key], r.get(f"{key}_min", r[key])) for r in rows],
            [gap(r.get(f"{key}_max", r[key]), r[key]) for r in rows]]


def _group(shape: tuple[int, int, int]) -> tuple[int, ...]:
    """Squares first, then the shapes of each weight (N, K), by M."""
    m, n, k = shape
    return () if m == n == k else (n, k)


def _ratios(rows: list[dict[str, Any]], ref: str) -> list[dict[str, Any]]:
    return [r for r in rows if not math.isnan(r[f"vs_{ref}"])]


def _panel(ax: Any, rows: list[dict[str, Any]], ref: str, name: str,
           shapes: list[tuple[int, int, int]], variants: list[tuple[str, str]]) -> None:
    """One reference's ratios, a series per (dtype, layout), shapes side by side."""
    for i, variant in enumerate(variants):
        mine = [r for r in rows if (r["dtype"], r["layout"]) == variant]
        offset = (i - (len(variants) - 1) / 2) * 0.8 / len(variants)
        xs = [shapes.index((r["m"], r["n"], r["k"])) + offset for r in mine]
        ys = [r[f"vs_{ref}"] for r in mine]
        ax.errorbar(xs, ys, yerr=range_bars(mine, f"vs_{ref}"), fmt=MARKERS[i % len(MARKERS)],
                    markersize=4, elinewidth=0.8, label=" ".join(variant))
    values = [r[f"vs_{ref}"] for r in rows]
    ratio_axis(ax, values + [v for r in rows for v in (r.get(f"vs_{ref}_min", math.nan),
                                                       r.get(f"vs_{ref}_max", math.nan))])
    for x in range(1, len(shapes)):  # a faint line between the squares and each (N, K)
        if _group(shapes[x]) != _group(shapes[x - 1]):
            ax.axvline(x - 0.5, color="0.85", linewidth=0.8)
    ax.grid(axis="y", alpha=0.3)
    ax.set_ylabel(f"ours / {name}")
    above = sum(v > 1 for v in values)
    ax.set_title(f"geomean {geomean(values):.3f} of {name}; ours faster on {above} of "
                 f"{len(values)}", fontsize=9, loc="left")


def write_plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Draw ``rows`` (``bench gemm``'s) into ``path`` (a PNG of at most 1600 px across)."""
    plt = pyplot()
    if plt is None:
        return
    shapes = sorted(dict.fromkeys((r["m"], r["n"], r["k"]) for r in rows),
                    key=lambda shape: (_group(shape), shape[0]))
    variants = list(dict.fromkeys((r["dtype"], r["layout"]) for r in rows))
    panels = [(ref, name) for ref, name in REFERENCES if _ratios(rows, ref)]
    fig, axes = plt.subplots(len(panels), 1, sharex=True, squeeze=False,
                             figsize=(min(16.0, max(7.0, 2.0 + 0.42 * len(shapes))),
                                      1.6 + 3.0 * len(panels)))
    for ax, (ref, name) in zip(axes[:, 0], panels):
        _panel(ax, _ratios(rows, ref), ref, name, shapes, variants)
    bottom = axes[-1, 0]
    bottom.set_xticks(range(len(shapes)), [f"{m}x{n}x{k}" for m, n, k in shapes],
                      rotation=55, ha="right", rotation_mode="anchor", fontsize=8)
    bottom.set_xlim(-0.6, len(shapes) - 0.4)
    bottom.set_xlabel("M x N x K (markers: dtype and layout of B; bars: range over the rounds)")
    fig.suptitle("bench gemm: our GEMM's TFLOP/s over cuBLAS's and Triton's (> 1: ours "
                 f"faster)\n{setup_line(rows)}", fontsize=11)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, ncol=len(variants), fontsize=8, loc="upper right")
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=100)
    plt.close(fig)
