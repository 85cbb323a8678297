"""Clock settling before an autotuning that has our choices, through Inductor's own
lowering on a virtual sm_90 device (CPU): the deferred GEMM node keeps its choices in the
order Inductor will time them."""

import pickle

import pytest
import torch.nn.functional as F
from torch._inductor import ir, select_algorithm

import cutedsl_inductor
from cutedsl_inductor import config
from cutedsl_inductor.autotune.select import settle_clocks_first
from cutedsl_inductor.template.caller import CuteDSLTemplateCaller
from tests.helpers import lowered, virtual_sm90_max_autotune


@pytest.fixture
def max_autotune(monkeypatch):
    with virtual_sm90_max_autotune(monkeypatch, "ATEN,CUTEDSL", gemm_max_configs=2):
        yield


def deferred_choices():
    fn = lambda x, w, b: F.gelu(x @ w.t() + b)  # noqa: E731
    with lowered(fn, (256, 512), (384, 512), (384,)) as graph:
        (multi,) = [b for b in graph.buffers if isinstance(b, ir.MultiTemplateBuffer)]
        return multi.choices


def test_our_first_choice_is_timed_first_after_settling_the_clock(max_autotune):
    choices = deferred_choices()
    ours = [c for c in choices if isinstance(c, CuteDSLTemplateCaller)]
    assert len(ours) == 2 and len(choices) > 2
    assert choices[0] is ours[0]
    assert ours[0].bmreq.settle_ms == config.autotune_settle_ms > 0
    assert ours[1].bmreq.settle_ms == 0
    # the subprocess path gets the mark with the request
    assert pickle.loads(pickle.dumps(ours[0].bmreq)).settle_ms == config.autotune_settle_ms


def test_with_settling_off_inductor_keeps_its_order(max_autotune):
    with config.patch(autotune_settle_ms=0):
        choices = deferred_choices()
    assert not isinstance(choices[0], CuteDSLTemplateCaller)  # ATen's, as Inductor lists it
    assert all(c.bmreq.settle_ms == 0 for c in choices if isinstance(c, CuteDSLTemplateCaller))


def test_a_list_without_our_choices_is_left_as_it_is():
    choices = [object(), object()]
    assert settle_clocks_first(choices) is choices


def test_installing_twice_registers_the_preprocessing_once():
    cutedsl_inductor.install()
    cutedsl_inductor.install()
    fns = select_algorithm.get_algorithm_selector_cache().preprocessing_fns
    assert fns.count(settle_clocks_first) == 1
