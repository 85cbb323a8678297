"""``bench model``'s measurements on CPU: a tiny Llama's variants compiled in one process,
each under its own Inductor options, timed in interleaved rounds; a first call and its
figures (real torch.compile on CPU; the GPU's runs are the lead's)."""

import pytest

from cutedsl_inductor.bench.model_measure import FirstCall, Job, first_call_of, measure_model
from cutedsl_inductor.bench.model_variants import OutputCode, Variant
from cutedsl_inductor.bench.model_workloads import Shape
from tests.bench.test_model_families import tiny

torch = pytest.importorskip("torch")


def test_variants_of_one_process_are_timed_in_the_same_rounds():
    job = Job("llama", "decode", (Shape(2, 8),), (Variant("eager"), Variant("default")),
              layers=1, new_tokens=4, steps=2, rounds=3, warmup=2)
    eager, compiled = measure_model(job, tiny("llama", layers=1), "cpu")
    assert [row["variant"] for row in (eager, compiled)] == ["eager", "default"]
    for row in (eager, compiled):
        assert row["ok"] and row["rel_err"] < 0.02, row
        assert (row["tokens"], row["rounds"], row["steps"]) == ("2x8+4", 3, 2)
        assert row["ms_min"] <= row["ms"] <= row["ms_max"]
        assert row["tokens_per_s"] == pytest.approx(2e3 / row["ms"])  # batch per ms/token
    assert "speedup_vs_eager" not in eager and "speedup_vs_max-autotune" not in compiled
    low, mid, high = (compiled[f"speedup_vs_eager{end}"] for end in ("_min", "", "_max"))
    assert low <= mid <= high
    assert compiled["cute_kernels"] == 0 and compiled["graph_skips"] == 0


def test_a_first_call_is_timed_checked_and_broken_down():
    case = FirstCall("llama", "prefill", Shape(2, 16), Variant("default"), layers=1)
    row = first_call_of(case, tiny("llama", layers=1), "cpu")
    assert row["first_call_ok"] and row["first_call_s"] > 0
    assert row["fx_hits"] + row["fx_misses"] + row["fx_bypasses"] > 0  # Inductor compiled
    assert row["first_call_cute_kernels"] == 0 and row["cute_compiled"] == 0


def test_a_variant_that_ran_another_ones_graph_is_refused():
    model = tiny("llama", layers=1)
    ids = torch.randint(0, 256, (1, 8))
    compiled = torch.compile(model, backend="eager")
    with OutputCode() as code:
        compiled(ids)  # Dynamo alone: no Inductor output code loads
    with pytest.raises(AssertionError, match="no output code"):
        code.check(Variant("default"))
