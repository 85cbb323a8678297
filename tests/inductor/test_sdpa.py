"""cutedsl::sdpa and cutedsl::sdpa_backward lowered on a virtual sm_90: the choices
offered (every eligible ATen backend and our FlexAttention forward / backward), and the
output code calling the one chosen.

Graphs from ``tests/inductor/sdpa_graphs.py``, rewritten by the joint-graph pass and
lowered by Inductor. Nothing can be timed here, so Inductor's own choice filter
(``test_configs.autotune_choice_name_regex``) leaves the choice a test makes win; a spy
records the lists before it. Triton is not installed: its kernels' source is written
without Triton's backend hash (a stand-in)."""

import dataclasses
import logging
import math
import re

import pytest
import torch
import torch.utils._triton
from torch._inductor import select_algorithm
from torch._inductor.debug import DebugContext
from torch._inductor.graph import GraphLowering
from torch._inductor.virtualized import V

from cutedsl_inductor import config
from cutedsl_inductor.bench.attention_sdpa import sdpa_kernel_of
from cutedsl_inductor.inductor import sdpa, sdpa_pass
from tests.helpers import kernel_definitions, load_kernels, use_virtual_sm90
from tests.inductor.sdpa_graphs import Case, trace

OURS = "cutedsl_sm90_flex_attention"


@pytest.fixture
def virtual(monkeypatch):
    use_virtual_sm90(monkeypatch)
    monkeypatch.setattr(torch.utils._triton, "triton_hash_with_backend", lambda: "none")
    monkeypatch.setattr(config, "flex_max_configs", 1)
    monkeypatch.setattr(config, "flex_persistent", "off")  # one choice


@dataclasses.dataclass(frozen=True)
class Selection:
    name: str
    choices: list[str]
    deferred: bool  # return_multi_template: the choice may be left to the scheduler


@pytest.fixture
def offered(monkeypatch):
    """Every autotuning, in order."""
    seen = []
    real = select_algorithm.AlgorithmSelectorCache.__call__

    def spy(self, name, choices, *args, **kwargs):
        seen.append(Selection(name, sorted(c.name for c in choices),
                              bool(kwargs.get("return_multi_template"))))
        return real(self, name, choices, *args, **kwargs)

    monkeypatch.setattr(select_algorithm.AlgorithmSelectorCache, "__call__", spy)
    return seen


def lower(case, winner):
    """The output code of ``case``'s rewritten joint graph, ``winner`` (a regex of choice
    names) left to win each autotuning."""
    gm, args, mode = trace(case)
    assert sdpa_pass.rewrite_sdpa(gm.graph) == 1
    gm.recompile()
    with torch._inductor.config.patch({"max_autotune": True,
                                       "test_configs.autotune_choice_name_regex": winner}):
        graph = GraphLowering(gm, example_inputs=args)
        with V.set_graph_handler(graph), V.set_debug_handler(DebugContext()), \
                V.set_fake_mode(mode):
            graph.run(*args)
            return graph.codegen()[0].value


def offers_every_backend(monkeypatch):
    """cuDNN's and efficient's checks admit the inputs, as a CUDA torch's would."""
    from torch.backends import cuda

    monkeypatch.setattr(cuda, "can_use_cudnn_attention", lambda params, debug: True)
    monkeypatch.setattr(cuda, "can_use_efficient_attention", lambda params, debug: True)


def ours(code):
    return [d for d in kernel_definitions(code) if d.targets[0].id.startswith(OURS)]


def run_calls(code):
    return re.findall(r"(\w+)\.run\(", code)


def test_ours_wins_forward_and_backward_in_the_output_code(virtual, offered):
    code = lower(Case(), OURS)
    names = [d.targets[0].id for d in ours(code)]
    assert len(names) == 2 and any("_bwd_" in n for n in names)
    assert set(names) <= set(run_calls(code))
    assert "= torch.ops.cutedsl.sdpa" not in code  # no ATen backend runs
    # the forward: our kernel and ATen flash, on flex's inputs; the backward likewise
    fwd, bwd = offered
    assert (fwd.name, bwd.name) == ("flex_attention", "flex_attention_backward")
    assert "cutedsl_sdpa_flash" in fwd.choices
    assert any(c.startswith(OURS) for c in fwd.choices)
    assert "cutedsl_sdpa_flash_backward" in bwd.choices
    assert any(c.startswith(OURS + "_bwd") for c in bwd.choices)
    assert not fwd.deferred and not bwd.deferred  # the winner decides the IR at once
    # the canonical logsumexp: ours (log2 units) times ln 2, divided for our backward
    assert repr(math.log(2.0)) in code and repr(1 / math.log(2.0)) in code
    assert sdpa_kernel_of("sdpa-choice", [code], "fwd") == "cutedsl"


def test_an_aten_win_calls_the_op_with_that_backend_alone(virtual, offered, monkeypatch):
    from torch.backends import cuda

    monkeypatch.setattr(cuda, "can_use_cudnn_attention", lambda params, debug: True)
    code = lower(Case(), "cutedsl_sdpa_cudnn")
    assert "= torch.ops.cutedsl.sdpa.default(" in code and ", 'cudnn')" in code
    assert "= torch.ops.cutedsl.sdpa_backward.default(" in code
    assert not ours(code)
    assert [len([c for c in s.choices if c.startswith("cutedsl_sdpa_")])
            for s in offered] == [2, 2]  # flash and cuDNN, forward and backward
    assert sdpa_kernel_of("sdpa-choice", [code], "bwd") == "cudnn"


@pytest.mark.parametrize("layout", ["blhd", "bhld"])
def test_every_eligible_backend_is_offered_whatever_its_output_strides(
        virtual, offered, monkeypatch, layout):
    """Efficient's forward writes (B, L, H, D) order, flex's the query's: efficient is
    timed (its output viewed in the choice set's strides) and, winning, runs as itself."""
    offers_every_backend(monkeypatch)
    code = lower(Case(layout=layout), "cutedsl_sdpa_efficient")
    backends = {"cutedsl_sdpa_flash", "cutedsl_sdpa_cudnn", "cutedsl_sdpa_efficient"}
    fwd, bwd = offered
    assert backends <= set(fwd.choices)
    assert {f"{b}_backward" for b in backends} <= set(bwd.choices)
    assert code.count(", 'efficient')") == 2


def test_a_mask_is_a_captured_tensor_of_our_kernels(virtual):
    """An additive mask broadcast over heads (stride 0) is read by the score_mod; the
    kernels compile for sm_90a."""
    code = lower(Case(backend="efficient", mask="bool", causal=False, seq=200), OURS)
    kernels = ours(code)
    assert len(kernels) == 2
    for kernel in kernels:
        assert "captures[0][" in kernel.value.args[1].value
    assert re.search(r"\.run\([^)]*reinterpret_tensor\(\w+, \(2, 4, 200, 200\), "
                     r"\(\d+, 0, \d+, 1\)", code)
    # one (B, 1, Lq, Lk) buffer of the mask, read by the forward and the backward
    assert len(re.findall(r"empty_strided_cuda\(\(2, \d, 200, 200\)", code)) == 1
    load_kernels(kernels)


@pytest.mark.parametrize("repeat_kv", [False, True], ids=["gqa", "repeated-kv"])
def test_gqa_takes_our_kernels(virtual, repeat_kv):
    code = lower(Case(kv_heads=2, repeat_kv=repeat_kv), OURS)
    assert len(ours(code)) == 2


def test_a_problem_ours_cannot_take_keeps_the_aten_choices(virtual, offered, caplog,
                                                          monkeypatch):
    from torch.backends import cuda

    monkeypatch.setattr(cuda, "can_use_cudnn_attention", lambda params, debug: True)
    with caplog.at_level(logging.WARNING):
        code = lower(Case(head_dim=96), "cutedsl_sdpa_cudnn")
    assert "head dims q/k 96/96, v 96: the kernel takes one of 64, 128" in caplog.text
    assert "ATen's backends ['flash', 'cudnn'] stay" in caplog.text
    assert ", 'cudnn')" in code and not ours(code)
    # timed where flex's lowering autotunes, ATen's choices alone
    assert [s.name for s in offered] == ["flex_attention", "flex_attention_backward"]
    assert all(c.startswith("cutedsl_sdpa_") for s in offered for c in s.choices)


def test_causal_with_unequal_lengths_is_not_ours(virtual, offered, caplog, monkeypatch):
    """Flex's lowering is not reached: the eligible backends are timed on their own."""
    offers_every_backend(monkeypatch)
    with caplog.at_level(logging.WARNING, logger=sdpa.__name__):
        code = lower(Case(backend="efficient", kv_seq=384), "cutedsl_sdpa_cudnn")
    assert "causal with Lq 256 != Lk 384" in caplog.text
    assert code.count(", 'cudnn')") == 2
    assert [(s.name, len(s.choices), s.deferred) for s in offered] == [
        ("cutedsl_sdpa", 2, False), ("cutedsl_sdpa_backward", 2, False)]


def test_one_backend_and_nothing_else_is_called_untimed(virtual, offered, monkeypatch):
    monkeypatch.setattr(sdpa, "why_not_ours", lambda *args: "refused for this test")
    code = lower(Case(), "no choice matches this")
    assert offered == []
    assert code.count(", 'flash')") == 2
