"""``bench model``'s run plan, ratios and argument checks (no GPU needed)."""

import pytest

from cutedsl_inductor.bench.model import BACKENDS, Case, cases_of
from cutedsl_inductor.bench.model_report import add_ratios, summary
from cutedsl_inductor.cli import parser


def args(*argv):
    argv = ["bench", "model", *argv]
    return parser(argv=argv).parse_args(argv)


def test_fusion_off_shares_the_caches_of_fusion_on():
    plan = cases_of(args("--families", "llama", "--workloads", "decode", "--variants",
                         "max-autotune,cutedsl", "--fusion", "on,off"))
    assert [(c.variant, c.fusion, group) for c, group in plan] == [
        ("max-autotune", None, "llama-decode-max-autotune"),
        ("cutedsl", True, "llama-decode-cutedsl"), ("cutedsl", False, "llama-decode-cutedsl")]
    assert plan[0][0].tokens == (64, 1)


def test_pdl_settings_run_each_of_our_cases_in_its_group():
    plan = cases_of(args("--families", "llama", "--workloads", "decode-graphs", "--variants",
                         "max-autotune,cutedsl", "--pdl", "off,on"))
    assert [(c.variant, c.pdl, group) for c, group in plan] == [
        ("max-autotune", None, "llama-decode-graphs-max-autotune"),
        ("cutedsl", False, "llama-decode-graphs-cutedsl"),
        ("cutedsl", True, "llama-decode-graphs-cutedsl")]


def test_the_variant_without_triton_runs_only_when_named_in_caches_of_its_own():
    assert [c.variant for c, _ in cases_of(args("--workloads", "prefill", "--families", "llama"))
            ] == ["eager", "default", "max-autotune", "cutedsl"]
    plan = cases_of(args("--families", "llama", "--workloads", "prefill", "--variants",
                         "cutedsl,cutedsl-no-triton", "--fusion", "on"))
    assert [(c.variant, c.fusion, group) for c, group in plan] == [
        ("cutedsl", True, "llama-prefill-cutedsl"),
        ("cutedsl-no-triton", True, "llama-prefill-cutedsl-no-triton")]
    assert BACKENDS[plan[1][0].variant] == "ATEN,CUTEDSL"


def test_tokens_override_every_workload():
    (case, _), = cases_of(args("--families", "gpt2", "--workloads", "train", "--variants",
                               "eager", "--tokens", "1x512"))
    assert case == Case("gpt2", "train", "eager", layers=2, batch=1, seq=512, steps=15)
    assert case.tokens == (1, 512)


@pytest.mark.parametrize("argv", [["--tokens", "4by2048"], ["--families", "bert"],
                                  ["--fusion", "maybe"], ["--pdl", "on,sometimes"],
                                  ["--workloads", "prefill,oops"]])
def test_bad_arguments_are_one_line_errors(argv, capsys):
    with pytest.raises(SystemExit):
        args(*argv)
    assert "error:" in capsys.readouterr().err


def row(variant, ms, first, warm=None, fusion=None, caches="cold", pdl=None):
    r = dict(family="llama", workload="prefill", variant=variant, fusion=fusion, pdl=pdl,
             ms=ms, first_call_s=first, caches=caches)
    if warm is not None:
        r["first_call_warm_s"] = warm
    return r


def test_ratios_are_against_max_autotune_of_the_same_workload():
    rows = [row("eager", 30.0, 1.0), row("max-autotune", 26.0, 50.0, 5.0),
            row("cutedsl", 24.0, 60.0, 5.5, fusion=True),
            row("cutedsl", 25.0, 20.0, fusion=False, caches="shared"),
            row("cutedsl", 20.0, 20.0, fusion=False, caches="shared", pdl=True)]
    add_ratios(rows)
    ours, off = rows[2], rows[3]
    assert ours["speedup_vs_max-autotune"] == pytest.approx(26 / 24)
    assert ours["speedup_vs_eager"] == pytest.approx(30 / 24)
    assert ours["first_call_vs_max_autotune"] == pytest.approx(1.2)
    assert ours["warm_first_call_vs_max_autotune"] == pytest.approx(1.1)
    assert "first_call_vs_max_autotune" not in off  # its caches were not cold
    text = summary(rows)
    assert "fusion on  1.083x   first call 1.20x / 1.10x" in text
    assert "fusion off 1.040x" in text
    assert "fusion off pdl on 1.300x" in text
