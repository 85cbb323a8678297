"""``bench model``'s run plan and argument checks (no GPU needed)."""

import json

import pytest

from cutedsl_inductor import config
from cutedsl_inductor.bench.model import first_calls_of, jobs_of, settle, variants_of
from cutedsl_inductor.bench.model_measure import FirstCall, Job
from cutedsl_inductor.bench.model_variants import BACKENDS, LEVERS, Variant
from cutedsl_inductor.bench.model_workloads import Shape
from cutedsl_inductor.cli import parser


def args(*argv):
    argv = ["bench", "model", *argv]
    return settle(parser(argv=argv).parse_args(argv))


def test_the_defaults_run_every_family_at_eight_layers_against_max_autotune():
    plan = jobs_of(args())
    assert {(job.family, job.workload) for job in plan} == {
        (family, workload) for family in ("llama", "mistral", "phi3", "gpt2")
        for workload in ("prefill", "decode", "small-m", "train")} | {
        ("bert", "prefill"), ("bert", "train")}  # an encoder neither decodes nor runs M = 64
    assert {job.layers for job in plan} == {8}
    assert plan[0].variants == (Variant("eager"), Variant("max-autotune"), Variant("cutedsl"))
    assert (plan[0].rounds, plan[0].steps, plan[0].warmup) == (7, 5, 3)


def test_decode_runs_every_context_and_batch_with_and_without_graphs():
    (job,) = jobs_of(args("--families", "llama", "--workloads", "decode"))
    assert job.shapes == tuple(Shape(batch, context, graphs) for context in (1024, 4096)
                               for batch in (1, 8, 64) for graphs in (False, True))
    assert job.new_tokens == 32
    (quick,) = jobs_of(args("--families", "llama", "--workloads", "decode", "--quick",
                            "--graphs", "on", "--batches", "1,64"))
    assert quick.shapes == (Shape(1, 1024, True), Shape(64, 1024, True))
    assert (quick.rounds, quick.steps) == (5, 3)


def test_step_workloads_keep_their_tokens_and_an_encoder_cuts_its_sequences():
    plan = {(job.family, job.workload): job.shapes
            for job in jobs_of(args("--families", "gpt2,bert", "--graphs", "off"))}
    assert plan[("gpt2", "prefill")] == (Shape(4, 2048),)
    assert plan[("gpt2", "small-m")] == (Shape(64, 1),)
    assert plan[("bert", "prefill")] == (Shape(16, 512),)
    assert plan[("bert", "train")] == (Shape(8, 512),)
    (job,) = jobs_of(args("--families", "bert", "--workloads", "train", "--tokens", "1x1024"))
    assert job.shapes == (Shape(2, 512),)


def test_our_settings_are_variants_of_one_job_and_first_calls_share_their_caches():
    (job,) = jobs_of(args("--families", "llama", "--workloads", "prefill", "--variants",
                          "max-autotune,cutedsl", "--fusion", "on,off", "--pdl", "off"))
    assert job.variants == (Variant("max-autotune"), Variant("cutedsl", True, False),
                            Variant("cutedsl", False, False))
    assert [(case.variant.label, group) for case, group in first_calls_of(job)] == [
        ("max-autotune", "llama-prefill-max-autotune"),
        ("cutedsl fusion on pdl off", "llama-prefill-cutedsl"),
        ("cutedsl fusion off pdl off", "llama-prefill-cutedsl")]


def test_levers_flip_one_at_a_time_from_the_package_settings():
    (job,) = jobs_of(args("--families", "llama", "--workloads", "decode", "--variants",
                          "max-autotune,cutedsl", "--levers"))
    with config.patch(epilogue_fusion=True, gemm_pdl=False, prologue_fusion=False,
                      sdpa=False):
        assert variants_of(args("--variants", "max-autotune,cutedsl", "--levers")) == (
            Variant("max-autotune"), Variant("cutedsl"), Variant("cutedsl", fusion=False),
            Variant("cutedsl", pdl=True), Variant("cutedsl", prologue=True),
            Variant("cutedsl", sdpa=True))
    assert [variant.label for variant in job.variants[2:]] == [
        f"cutedsl {lever} {'off' if getattr(config, knob) else 'on'}"
        for lever, knob in LEVERS.items()]
    assert len(first_calls_of(job)) == 6  # every compiled variant, ours in one cache group
    crossed = variants_of(args("--variants", "cutedsl", "--pdl", "on,off", "--prologue",
                               "on,off"))
    assert [(v.fusion, v.pdl, v.prologue, v.sdpa) for v in crossed] == [
        (None, True, True, None), (None, True, False, None), (None, False, True, None),
        (None, False, False, None)]
    assert Variant("cutedsl", sdpa=True).knobs() == {"sdpa": True}
    assert Variant("cutedsl", pdl=True).knobs() == {"gemm_pdl": True}


def test_eager_has_no_first_call_and_the_first_calls_take_the_first_shape():
    (job,) = jobs_of(args("--families", "phi3", "--workloads", "decode", "--contexts", "4096",
                          "--batches", "64,1", "--graphs", "on,off"))
    cases = first_calls_of(job)
    assert [case.variant.name for case, _ in cases] == ["max-autotune", "cutedsl"]
    assert {case.shape for case, _ in cases} == {Shape(64, 4096, True)}


def test_the_variant_without_triton_runs_only_when_named():
    (job,) = jobs_of(args("--families", "llama", "--workloads", "train", "--variants", "all"))
    assert [v.name for v in job.variants] == ["eager", "default", "max-autotune", "cutedsl",
                                              "cutedsl-no-triton"]
    assert BACKENDS["cutedsl-no-triton"] == "ATEN,CUTEDSL"


def test_jobs_and_first_calls_travel_to_their_process_as_json():
    (job,) = jobs_of(args("--families", "mistral", "--workloads", "decode", "--fusion",
                          "off", "--profile", "2", "--new-tokens", "16"))
    assert Job.from_json(job.to_json()) == job
    assert json.loads(job.to_json())["shapes"][0] == {"batch": 1, "seq": 1024, "graphs": False}
    case, _ = first_calls_of(job)[1]
    assert FirstCall.from_json(case.to_json()) == case


@pytest.mark.parametrize("argv", [["--tokens", "4by2048"], ["--families", "bart"],
                                  ["--fusion", "maybe"], ["--pdl", "on,sometimes"],
                                  ["--prologue", "yes"],
                                  ["--workloads", "prefill,decode-graphs"],
                                  ["--contexts", "1024,0"], ["--batches", "eight"],
                                  ["--graphs", "default"], ["--rounds", "0"]])
def test_bad_arguments_are_one_line_errors(argv, capsys):
    with pytest.raises(SystemExit):
        args(*argv)
    assert "error:" in capsys.readouterr().err


def test_a_context_past_the_positions_is_refused_before_anything_runs():
    with pytest.raises(SystemExit, match="8192 positions"):
        args("--workloads", "decode", "--contexts", "8192")
    args("--families", "bert", "--contexts", "8192")  # no decoder, no decode
