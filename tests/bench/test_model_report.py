"""``bench model``'s report: lines, the table, first-call ratios, the CSV and the plot
named after the GPU (no GPU needed)."""

import csv

import pytest

from cutedsl_inductor.bench.model_report import (
    add_first_call_ratios,
    agreement,
    file_stem,
    line,
    plot,
    summary,
    write_csv,
)


def row(variant, ms, workload="decode", tokens="8x1024+32", graphs=True, fusion=None,
        speedup=None, **extra):
    r = dict(gpu="NVIDIA H100 80GB HBM3", torch="2.13.0", family="llama", workload=workload,
             tokens=tokens, batch=8, seq=1024, graphs=graphs, layers=8, variant=variant,
             fusion=fusion, pdl=None, ms=ms, ms_min=ms * 0.99, ms_max=ms * 1.01,
             tokens_per_s=8e3 / ms, host_ms=ms / 3, rel_err=0.01, rel_err_eager=0.011,
             ok=True, cute_kernels=12 if variant.startswith("cutedsl") else 0, graph_skips=0,
             **extra)
    if speedup is not None:
        r.update({"speedup_vs_max-autotune": speedup[0], "speedup_vs_max-autotune_min": speedup[1],
                  "speedup_vs_max-autotune_max": speedup[2]})
    return r


def rows():
    return [row("max-autotune", 2.0, first_call_s=40.0, first_call_warm_s=4.0, caches="cold"),
            row("cutedsl", 1.8, fusion=True, speedup=(1.11, 1.08, 1.13), first_call_s=50.0,
                first_call_warm_s=4.4, caches="cold"),
            row("cutedsl", 1.9, fusion=False, speedup=(1.05, 1.01, 1.06), first_call_s=20.0,
                caches="shared"),
            row("max-autotune", 30.0, workload="prefill", tokens="4x2048", graphs=False),
            row("cutedsl", 28.0, workload="prefill", tokens="4x2048", graphs=False,
                speedup=(1.07, 1.05, 1.08))]


def test_first_calls_are_against_max_autotune_where_the_caches_were_cold():
    table = rows()
    add_first_call_ratios(table)
    ours, shared = table[1], table[2]
    assert ours["first_call_vs_max_autotune"] == pytest.approx(1.25)
    assert ours["warm_first_call_vs_max_autotune"] == pytest.approx(1.1)
    assert "first_call_vs_max_autotune" not in shared
    assert "first_call_vs_max_autotune" not in table[0]


def test_the_line_and_the_table_show_the_median_round_ratio_and_its_range():
    table = rows()
    add_first_call_ratios(table)
    text = line(table[1])
    assert text.startswith("llama   decode    8x1024+32 graphs cutedsl fusion on")
    assert "1.800 ms/token" in text and "1.110x [1.080-1.130]" in text
    assert text.endswith(") ok  first call 50.0 / 4.4 s (cold)")
    assert "ms/step" in line(table[4]) and "graphs" not in line(table[4])
    lines = summary(table).splitlines()
    (ours,) = [x for x in lines if "cutedsl fusion on" in x]
    assert "llama decode 8x1024+32 graphs" in ours and "1.110x [1.080-1.130]" in ours
    assert ours.endswith("ok  first call 1.25x / 1.10x")
    (reference,) = [x for x in lines if "prefill" in x and "max-autotune" in x]
    assert " - " in reference  # no speedup over itself


def test_csv_and_plot_are_named_after_the_gpu(tmp_path):
    table = rows()
    stem = file_stem(table)
    assert stem == "model_bench_h100"
    assert file_stem([{"gpu": "NVIDIA H200"}]) == "model_bench_h200"
    assert file_stem([{"gpu": "cpu"}]) == "model_bench_cpu"
    write_csv(table, tmp_path / f"{stem}.csv")
    with open(tmp_path / f"{stem}.csv", newline="") as f:
        read = list(csv.DictReader(f))
    assert [r["variant"] for r in read] == [r["variant"] for r in table]
    assert read[1]["speedup_vs_max-autotune_min"] == "1.08"
    assert read[0]["speedup_vs_max-autotune"] == ""  # the reference has no ratio
    plot(table, tmp_path / f"{stem}.png")
    assert (tmp_path / f"{stem}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_two_runs_agree_where_every_speedup_is_within_two_percent(tmp_path):
    runs = []
    for index, factor in enumerate((1.0, 1.015, 1.03)):
        table = rows()
        for r in table:
            if "speedup_vs_max-autotune" in r:
                r["speedup_vs_max-autotune"] *= factor
        write_csv(table, tmp_path / f"{index}.csv")
        with open(tmp_path / f"{index}.csv", newline="") as f:
            runs.append(list(csv.DictReader(f)))
    text, agree = agreement(runs[0], runs[1])
    assert agree and text.endswith("3 speedups, largest difference 1.5%: within 2%")
    assert "llama decode 8x1024+32 graphs cutedsl fusion off" in text
    text, agree = agreement(runs[0], runs[2])
    assert not agree and "+3.0%" in text
    assert agreement(runs[0], [])[1] is False  # nothing compared, nothing shown
