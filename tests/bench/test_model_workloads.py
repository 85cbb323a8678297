"""``bench model``'s step workloads on CPU: tiny models of every family, their outputs
(logits; the loss and every gradient) checked against an fp32 copy."""

import copy

import pytest

from cutedsl_inductor.bench.model_families import FAMILIES
from cutedsl_inductor.bench.model_workloads import Shape, Steps, rel_error
from tests.bench.test_model_families import tiny

torch = pytest.importorskip("torch")


def test_the_error_is_relative_but_a_zero_reference_has_a_floor():
    refs = [torch.full((4,), 1.0), torch.full((4,), 0.01), torch.zeros(4)]
    assert rel_error([r * 1.001 for r in refs], refs) == pytest.approx(1e-3, rel=1e-3)
    assert rel_error([refs[0], refs[1] * 1.1, refs[2]], refs) == pytest.approx(0.1, rel=1e-3)
    # a gradient that is zero in exact arithmetic, with rounding noise around it
    assert rel_error([refs[0], refs[1], torch.full((4,), 1e-9)], refs) < 1e-3
    assert rel_error([refs[0], refs[1], torch.full((4,), 1e-3)], refs) > 0.1
    assert rel_error([refs[0], refs[1] * float("nan"), refs[2]], refs) == float("inf")


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("workload", ["prefill", "train"])
def test_steps_of_every_family_are_checked_against_an_fp32_copy(family, workload):
    model = tiny(family)
    steps = Steps(workload, Shape(2, 24), model.config.vocab_size, "cpu")
    with torch.set_grad_enabled(workload == "train"):
        steps.reference(copy.deepcopy(model).float())
        right = steps.runner(model, model).check()
        # a step of other weights (every matrix off by a tenth) is out of bounds
        wrong = copy.deepcopy(model)
        torch.manual_seed(2)
        with torch.no_grad():
            for parameter in wrong.parameters():
                if parameter.dim() == 2:
                    parameter.add_(torch.randn_like(parameter) * parameter.std() / 10)
        wrong_error = steps.runner(wrong, wrong).check()
    assert right < 0.02  # bf16's rounding
    assert wrong_error > 2 * right + 1e-3


def test_a_training_step_must_accumulate_its_gradients():
    model = tiny("llama")
    steps = Steps("train", Shape(2, 16), model.config.vocab_size, "cpu")
    steps.reference(copy.deepcopy(model).float())
    runner = steps.runner(model, model)
    assert runner.check() < 0.02
    runner.prepare = lambda: None  # no zeroing: the first check's gradients stay
    assert runner.check() > 0.3  # the first step's gradients are then twice the reference's
