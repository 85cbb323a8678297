"""``bench aot`` without a GPU: its arguments and refusal, its plan of fresh processes,
its figures, the workloads' exports, and the deployment half of the pipeline run on the
CPU (a tiny Llama's decode step packaged by AOTInductor for the CPU, loaded, checked and
timed in processes where CuTe DSL and this package do not import)."""

import shutil

import pytest
import torch

from cutedsl_inductor.bench import aot_run
from cutedsl_inductor.bench.aot import line, main, run_stage, stages, summarize
from cutedsl_inductor.bench.aot_build import Case, build, module_and_inputs, reference
from cutedsl_inductor.bench.model_families import FAMILIES
from cutedsl_inductor.cli import parser

TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256)


def args(*argv):
    argv = ["bench", "aot", *argv]
    return parser(argv=argv).parse_args(argv)


def test_the_defaults_run_prefill_and_decode_of_a_two_layer_llama(tmp_path):
    given = args("--out", str(tmp_path))
    assert given.workloads == ["prefill", "decode"] and given.layers == 2
    assert (given.context, given.rounds, given.steps, given.warmup) == (1024, 7, 20, 3)
    assert not given.keep


@pytest.mark.parametrize("argv", [["--workloads", "train"], ["--layers", "0"],
                                  ["--context", "-1"], ["--rounds", "0"], ["--steps", "x"]])
def test_bad_arguments_are_one_line_errors(argv, capsys):
    with pytest.raises(SystemExit):
        args(*argv)
    assert "error:" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for GPU-less hosts")
def test_without_an_sm90_gpu_it_says_so_and_exits_2(tmp_path, capsys):
    assert main(args("--out", str(tmp_path))) == 2
    assert capsys.readouterr().out.strip() == "bench aot needs an sm_90 GPU"


def test_each_build_gets_its_own_inductor_cache_and_the_runs_read_the_cases_files(tmp_path):
    case = Case("prefill", 2, 1024, str(tmp_path))
    plan = stages(case, args("--rounds", "3"), tmp_path / "scratch")
    assert [s.name for s in plan] == ["reference", "build cutedsl", "build max-autotune",
                                      "load cutedsl", "load max-autotune", "time"]
    assert dict(plan[1].env)["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "scratch" / "cutedsl")
    assert dict(plan[2].env)["TORCHINDUCTOR_CACHE_DIR"] != dict(plan[1].env)[
        "TORCHINDUCTOR_CACHE_DIR"]
    # by path: it imports torch alone; faulthandler: a crash leaves its Python stack
    assert plan[3].argv[1:4] == ("-X", "faulthandler", aot_run.__file__)
    assert str(case.package("cutedsl")) in plan[3].argv[-1]
    assert '"rounds": 3' in plan[5].argv[-1] and '"check_stride": 64' in plan[3].argv[-1]


def test_the_speedup_is_the_median_round_ratio_and_goals_are_named():
    answers = {"reference": {"eager_error": 0.01},
               "build cutedsl": {"kernels_of_ours": 5},
               "load cutedsl": {"load_s": 2.5, "first_call_s": 0.5, "ok": True},
               "load max-autotune": {"load_s": 1.5, "first_call_s": 0.5, "ok": True},
               "time": {"ms_per_step": [[10.0, 9.0, 8.0], [11.0, 10.0, 12.0]]}}
    row = summarize("decode", answers)
    assert row["cutedsl_ms"] == 9.0 and row["max-autotune_ms"] == 11.0
    # the rounds' ratios: 11/10, 10/9, 12/8
    assert row["speedup"] == pytest.approx(10 / 9) and row["speedup_min"] == pytest.approx(1.1)
    assert row["load_ratio"] == 1.5 and row["cutedsl_kernels_of_ours"] == 5
    said = line(row)
    assert "1.111x (rounds' min 1.100x; goal >= 1.1x met)" in said
    assert "load and first call 3.00 s vs 2.00 s: 1.50x (goal <= 1.2x NOT met)" in said


def test_a_stage_that_fails_names_its_log(tmp_path):
    from cutedsl_inductor.bench.aot import Stage

    answer, failed = run_stage(Stage("load cutedsl", ("false",)), tmp_path)
    assert answer is None and failed.startswith("load cutedsl: rc 1, log ")


@pytest.mark.parametrize("workload", ["prefill", "decode"])
def test_the_workloads_export_and_decode_writes_its_kv_cache(workload):
    model = FAMILIES["llama"].build(1, "cpu", **TINY)
    module, inputs = module_and_inputs(Case(workload, 1, 32, "unused"), model, "cpu")
    exported = torch.export.export(module, inputs, strict=False).run_decompositions()
    mutated = set(exported.graph_signature.buffers_to_mutate.values())
    if workload == "decode":
        assert {"key_cache_0", "value_cache_0"} <= mutated  # the cache, not a constant
        assert inputs[0].shape == (8, 1) and inputs[1].tolist() == [32]
    else:
        assert not mutated and inputs[0].shape == (4, 2048)


def test_a_tiny_decode_package_is_loaded_checked_and_timed_where_cute_dsl_does_not_import(
        tmp_path, monkeypatch):
    """The baseline's package (no kernel of ours: AOTInductor for the CPU) through the
    run's own stages; a copy of it stands in for ours in the timing."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    case = Case("decode", 1, 32, str(tmp_path))
    assert reference(case, "cpu", **TINY)["eager_error"] > 0
    assert build(case, "max-autotune", "cpu", **TINY)["kernels_of_ours"] == 0
    shutil.copy(case.package("max-autotune"), case.package("cutedsl"))
    plan = {s.name: s for s in stages(case, args("--rounds", "2", "--steps", "2", "--warmup",
                                                 "1"), tmp_path / "scratch")}
    answers = {}
    for name in ("load max-autotune", "time"):
        answers[name], failed = run_stage(plan[name], tmp_path / "logs")
        assert not failed, failed
    assert answers["load max-autotune"]["ok"] and answers["load max-autotune"]["load_s"] > 0
    assert [len(r) for r in answers["time"]["ms_per_step"]] == [2, 2]
    assert summarize("decode", answers)["speedup"] > 0
