"""``bench attention``: its arguments, cases, mask densities (against a brute-force count),
CSV and plot from rows, and one tiny run on the CPU (Inductor's CPU flex kernel as
``triton``; ours, cuDNN and flex's backward cannot run there, and their rows say why);
on an sm_90 GPU (``gpu``), a tiny run of ours forward and backward."""

import math
from pathlib import Path

import pytest
import torch

from cutedsl_inductor.bench import attention
from cutedsl_inductor.bench.attention_report import (
    FIELDS,
    read_rows,
    summary,
    write_csv,
    write_plot,
)
from cutedsl_inductor.cli import main, parser

README = Path(__file__).resolve().parents[2] / "README.md"


def parse(*argv):
    argv = ["bench", "attention", *argv]
    return parser(argv=argv).parse_args(argv)


def test_the_default_run_is_the_issue_s_suite_and_quick_a_subset():
    cases = attention.cases_of(parse())
    assert len(cases) == 3 * 2 * 4 and {c.dtype for c in cases} == {"bf16"}
    assert {(c.batch, c.heads, c.seq) for c in cases} == {(8, 16, 2048), (4, 32, 8192),
                                                          (1, 32, 32768)}
    quick = attention.cases_of(parse("--quick"))
    assert [(c.seq, c.head_dim, c.mask) for c in quick] == [
        (2048, 128, mask) for mask in attention.MASKS]
    chosen = attention.cases_of(parse("--quick", "--head-dims", "64", "--masks", "alibi",
                                      "--dtypes", "bf16,fp16"))
    assert [(c.head_dim, c.mask, c.dtype) for c in chosen] == [(64, "alibi", "bf16"),
                                                               (64, "alibi", "fp16")]
    args = parse("--shapes", "2x4x512,1x2x128", "--variants", "all", "--directions", "bwd")
    assert [(c.batch, c.heads, c.seq) for c in attention.cases_of(args)][::8] == [
        (2, 4, 512), (1, 2, 128)]
    assert args.variants == list(attention.VARIANTS) and args.directions == ["bwd"]
    shards = [attention.cases_of(parse("--shard", f"{k}/5")) for k in range(1, 6)]
    assert sorted(sum(shards, []), key=cases.index) == cases and len(shards[4]) == 4


def test_sdpa_runs_on_plain_causal_only():
    case = attention.Case(1, 2, 256, 64, "causal", "bf16")
    asked = ["ours", "triton", "flash", "sdpa-flash", "sdpa-cudnn"]
    assert attention.variants_of(case, asked) == asked
    for mask in ("sliding", "document", "alibi"):
        other = attention.Case(1, 2, 256, 64, mask, "bf16")
        assert attention.variants_of(other, asked) == ["ours", "triton", "flash"]
        assert attention.variants_of(other, ["sdpa-choice"]) == []
    assert attention.variants_of(case, ["sdpa-choice"]) == ["sdpa-choice"]


@pytest.mark.parametrize("argv, message", [
    (["--shapes", "8x16"], "'8x16' is not BxHxS (positive integers)"),
    (["--head-dims", "64,0"], "'0' is not a positive head dim"),
    (["--masks", "causal,full"], "'full': not a mask (one of causal, sliding, document, "
                                 "alibi, or all)"),
    (["--variants", "fa3"], "'fa3': not a variant (one of ours, triton, triton-tuned, "
                            "flash, sdpa-flash, sdpa-cudnn, sdpa-choice, or all)"),
    (["--directions", "up"], "'up': not a direction (one of fwd, bwd)"),
    (["--dtypes", "fp8"], "'fp8': not a dtype (one of bf16, fp16)"),
    (["--steps", "0"], "'0' is not a positive integer"),
    (["--rounds", "x"], "'x' is not a positive number of rounds"),
    (["--shard", "3/2"], "'3/2' is not K/N with 1 <= K <= N"),
    (["--merge", "/nonexistent"], "'/nonexistent': cannot read /nonexistent"),
    (["--merge", str(README)], "is not a bench attention CSV (without the column(s) batch"),
])
def test_a_wrong_argument_is_one_error_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exit:
        main(["bench", "attention", *argv])
    assert exit.value.code == 2
    (error,) = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert message in error


def brute_force(mask_mod, seq):
    """The pairs ``mask_mod`` keeps, asked one (q, kv) pair at a time."""
    zero = torch.tensor(0)
    return sum(bool(mask_mod(zero, zero, torch.tensor(q), torch.tensor(kv)))
               for q in range(seq) for kv in range(seq))


@pytest.mark.parametrize("mask", attention.MASKS)
def test_the_density_is_the_exact_fraction_of_pairs_kept(mask, monkeypatch):
    monkeypatch.setattr(attention, "WINDOW", 16)
    monkeypatch.setattr(attention, "DOCUMENT", 24)
    seq = 100
    case = attention.Case(1, 2, seq, 64, mask, "bf16")
    _, mask_mod = attention.mods(case, "cpu")
    expected = brute_force(mask_mod, seq) / seq ** 2
    assert attention.density(mask_mod, seq, chunk=7 * seq) == expected  # in 15 chunks
    assert attention.density(mask_mod, seq) == expected  # in one
    if mask in ("causal", "alibi"):
        assert expected == (seq + 1) / (2 * seq)
    if mask == "sliding":
        assert expected == sum(min(q + 1, 16) for q in range(seq)) / seq ** 2


def test_documents_cut_the_sequence_into_seq_over_1024_parts():
    ids = attention.document_ids(8192, "cpu")
    assert ids[0] == 0 and ids[-1] == 7 and bool((ids.diff() >= 0).all())
    assert torch.equal(ids, attention.document_ids(8192, "cpu"))  # seeded
    lengths = torch.bincount(ids).tolist()
    density = attention.density(attention.mods(
        attention.Case(1, 1, 8192, 64, "document", "bf16"), "cpu")[1], 8192)
    assert density == sum(n * (n + 1) // 2 for n in lengths) / 8192 ** 2


def test_flops_count_the_kept_pairs_and_backward_two_and_a_half_times():
    case = attention.Case(8, 16, 2048, 128, "causal", "bf16")
    forward = 4 * 8 * 16 * 2048 * 2048 * 128 * 0.5
    assert attention.flops(case, 0.5, "fwd") == forward
    assert attention.flops(case, 0.5, "bwd") == 2.5 * forward


def test_a_failure_s_reason_is_its_innermost_cause_on_one_line():
    try:
        try:
            raise ValueError("head dim 96:\n  not one of (64, 128)")
        except ValueError as inner:
            raise RuntimeError("backend='inductor' raised") from inner
    except RuntimeError as err:
        assert attention.reason(err) == "ValueError: head dim 96: not one of (64, 128)"


VARIANTS = ["ours", "triton", "flash", "sdpa-flash", "sdpa-cudnn"]


def rows_of_a_run():
    """Rows as a GPU run makes them: two cases, both directions, one variant failed."""
    rows = []
    for mask in ("causal", "document"):
        case = attention.Case(8, 16, 2048, 128, mask, "bf16")
        for direction in attention.DIRECTIONS:
            for i, name in enumerate(attention.variants_of(case, VARIANTS)):
                row = attention._row(case, direction, name, 0.5, "")
                row.update(kernel="cutedsl" if name == "ours" and direction == "fwd" else "x",
                           ms=1.0 + i, tflops=400.0 / (1 + i), max_diff=1e-3, ok=True,
                           gpu="NVIDIA H200", torch="2.11.0", cute_dsl="4.8.1")
                if name == "ours":
                    for ref in ("triton", "flash", "sdpa-flash")[:3 if mask == "causal" else 2]:
                        ratio = {"triton": 2.0, "flash": 0.5}.get(ref, 3.0)
                        # Triton's: the ratio of medians a rounding above the rounds' range
                        high = ratio * (1 - 1e-7 if ref == "triton" else 1.01)
                        row.update({f"vs_{ref}": ratio, f"vs_{ref}_min": ratio * 0.98,
                                    f"vs_{ref}_max": high})
                if name == "sdpa-cudnn":
                    row = attention._row(case, direction, name, 0.5, "RuntimeError: no cuDNN")
                rows.append(row)
    return rows


def test_the_csv_round_trips_and_the_plot_fits_a_screen(tmp_path):
    image = pytest.importorskip("matplotlib.image")
    rows = rows_of_a_run()
    write_csv(rows, tmp_path / "attention_bench.csv")
    read = read_rows(tmp_path)
    assert len(read) == len(rows) and list(read[0]) == FIELDS
    assert read[0]["vs_triton"] == 2.0 and read[0]["ok"] is True and read[0]["seq"] == 2048
    failed = next(r for r in read if r["variant"] == "sdpa-cudnn")
    assert failed["error"] == "RuntimeError: no cuDNN" and math.isnan(failed["tflops"])
    text = summary(read)
    assert "fwd ours / triton: geomean 2.000 over 2 cases, >= 1.5 on 2" in text
    assert "bwd ours / sdpa-flash: geomean 3.000 over 1 cases" in text
    assert "fwd ours / flash: geomean 0.500 over 2 cases, >= 1.0 on 0" in text
    assert "ours' backward ran on x (2 cases): no CuteDSL backward was offered" in text
    assert "2 of 16 rows failed or differ from triton's" in text
    write_plot(read, tmp_path / "attention_bench.png")
    height, width, _ = image.imread(tmp_path / "attention_bench.png").shape
    assert 1000 <= width <= 1600 and 600 <= height <= 1000


def test_a_tiny_run_on_the_cpu_measures_what_runs_and_says_why_the_rest_cannot(
        tmp_path, capsys):
    args = parse("--shapes", "1x2x256", "--head-dims", "64", "--masks", "causal",
                 "--steps", "2", "--warmup", "1", "--rounds", "2", "--out", str(tmp_path))
    rows = {(r["direction"], r["variant"]): r for r in attention.run(args, device="cpu")}
    triton = rows["fwd", "triton"]
    assert triton["kernel"] == "cpp" and triton["ok"] and triton["max_diff"] == 0.0
    assert triton["tflops"] > 0 and triton["density"] == 257 / 512 and triton["gpu"] == "cpu"
    flash = rows["fwd", "sdpa-flash"]
    assert flash["kernel"] == "flash" and flash["ok"] and 0 < flash["max_diff"] < 2e-2
    assert rows["bwd", "sdpa-flash"]["ok"]  # finite, no triton row to compare with
    assert "is not in the forward's output code" in rows["fwd", "ours"]["error"]
    assert "No viable backend" in rows["fwd", "sdpa-cudnn"]["error"]
    for name in ("ours", "triton"):
        assert "does not support backward on CPU" in rows["bwd", name]["error"]
    assert len(read_rows(tmp_path)) == 8
    capsys.readouterr()
    assert main(["bench", "attention", "--merge", str(tmp_path), "--out",
                 str(tmp_path / "merged")]) == 1  # rows failed
    out = capsys.readouterr().out
    assert "1x2x256 d64 causal" in out and "5 of 8 rows failed" in out
    assert (tmp_path / "merged" / "attention_bench.csv").exists()


def test_profiled_rows_list_their_kernels_and_the_profile_csv_has_a_line_each(tmp_path):
    """On the CPU the profiler records no CUDA kernel: each row's list is empty."""
    args = parse("--shapes", "1x2x128", "--head-dims", "64", "--masks", "causal",
                 "--variants", "triton", "--directions", "fwd", "--steps", "1",
                 "--warmup", "1", "--rounds", "1", "--profile", "2", "--out", str(tmp_path))
    (row,) = attention.run(args, device="cpu")
    assert row["ok"] and row["kernels"] == []
    lines = (tmp_path / "attention_profile.csv").read_text().splitlines()
    assert lines == ["batch,heads,seq,head_dim,mask,dtype,direction,variant,kernel_name,"
                     "ms,launches"]
    assert len(read_rows(tmp_path)) == 1  # the bench CSV keeps its columns


@pytest.mark.skipif(attention.flash_installed(), reason="flash-attn 4 is installed here")
def test_without_flash_attn_4_the_flash_variant_is_a_row_naming_the_wheel(tmp_path):
    assert "flash" not in parse().variants  # not asked for by default where it cannot run
    args = parse("--shapes", "1x2x128", "--head-dims", "64", "--masks", "causal",
                 "--variants", "flash", "--directions", "fwd", "--steps", "1",
                 "--warmup", "1", "--rounds", "1", "--out", str(tmp_path))
    (row,) = attention.run(args, device="cpu")
    assert "install the flash-attn-4 wheel" in row["error"] and not row["ok"]


def test_the_sdpa_choice_set_is_a_failed_row_where_it_does_not_run(tmp_path, capsys):
    """On the CPU, compiled SDPA runs Inductor's CPU attention, not the choice set."""
    args = parse("--shapes", "1x2x128", "--head-dims", "64", "--masks", "causal",
                 "--variants", "sdpa-choice", "--directions", "fwd", "--steps", "1",
                 "--warmup", "1", "--rounds", "1", "--out", str(tmp_path))
    (row,) = attention.run(args, device="cpu")
    assert "the SDPA choice set is not in the output code" in row["error"]


@pytest.mark.gpu
def test_a_tiny_run_of_the_sdpa_choice_set_on_the_gpu(tmp_path):
    args = parse("--shapes", "1x4x1024", "--head-dims", "64", "--masks", "causal",
                 "--variants", "sdpa-flash,sdpa-choice", "--steps", "3", "--rounds", "2",
                 "--out", str(tmp_path))
    rows = attention.run(args)
    assert all(r["ok"] for r in rows), [r["error"] for r in rows]
    choice = [r for r in rows if r["variant"] == "sdpa-choice"]
    assert {r["kernel"] for r in choice} <= {"cutedsl", "flash", "cudnn", "efficient"}
    assert all(r["vs_sdpa-flash"] > 0 for r in choice)


@pytest.mark.gpu
def test_a_tiny_run_of_ours_on_the_gpu(tmp_path):
    args = parse("--shapes", "1x4x1024", "--head-dims", "64", "--masks", "causal,alibi",
                 "--variants", "ours,triton,sdpa-flash", "--steps", "3", "--rounds", "2",
                 "--profile", "2", "--out", str(tmp_path))
    rows = attention.run(args)
    assert all(r["ok"] for r in rows), [r["error"] for r in rows]
    ours = [r for r in rows if r["variant"] == "ours"]
    assert [r["kernel"] for r in ours if r["direction"] == "fwd"] == ["cutedsl", "cutedsl"]
    for row in ours:  # CuTe DSL names every kernel kernel_cutlass_...
        (kernel,) = [k for k in row["kernels"] if k.name.startswith("kernel_cutlass_")][:1]
        assert kernel.launches == 1.0 and 0 < kernel.ms <= row["ms"] * 1.5
    assert all(r["vs_triton"] > 0 for r in ours)


@pytest.mark.gpu
def test_a_tiny_run_of_flex_s_flash_backend_on_the_gpu(tmp_path):
    """flash-attn 4 (with quack-kernels, einops, torch-c-dlpack-ext) where installed."""
    pytest.importorskip("flash_attn.cute")
    args = parse("--shapes", "1x4x1024", "--head-dims", "128", "--masks", "causal",
                 "--variants", "ours,triton,flash", "--directions", "fwd", "--steps", "3",
                 "--rounds", "2", "--out", str(tmp_path))
    rows = {r["variant"]: r for r in attention.run(args)}
    assert rows["flash"]["ok"] and rows["flash"]["kernel"] == "flash", rows["flash"]["error"]
    assert rows["ours"]["vs_flash"] > 0
