"""The joint-graph rewrite of SDPA backend op pairs into cutedsl::sdpa / sdpa_backward:
each supported case rewritten, each unsupported one left with its reason, the eligible
backends from torch's checks, and the pass only where it can change the code (graphs
from ``tests/inductor/sdpa_graphs.py``)."""

import logging

import pytest
import torch
from torch._inductor.fx_passes import joint_graph

from cutedsl_inductor import config
from cutedsl_inductor.inductor import sdpa_pass
from tests.inductor.sdpa_graphs import Case, targets, trace

SDPA = torch.ops.cutedsl.sdpa.default
SDPA_BACKWARD = torch.ops.cutedsl.sdpa_backward.default


def rewritten(case):
    gm, _, _ = trace(case)
    count = sdpa_pass.rewrite_sdpa(gm.graph)
    gm.graph.lint()
    return gm, count


def call(gm, target):
    return next(n for n in gm.graph.nodes if n.target is target)


@pytest.mark.parametrize("backend", ["flash", "efficient", "cudnn"])
def test_each_backends_pair_becomes_our_two_ops(backend):
    mask = None if backend == "flash" else "additive"
    gm, count = rewritten(Case(backend=backend, mask=mask, causal=backend == "flash"))
    assert count == 1
    assert targets(gm).count(SDPA) == 1 and targets(gm).count(SDPA_BACKWARD) == 1
    assert not set(targets(gm)) & (set(sdpa_pass.FORWARD) | set(sdpa_pass.BACKWARD.values()))
    forward, backward = call(gm, SDPA), call(gm, SDPA_BACKWARD)
    q, k, v, bias, causal, scale, backends = forward.args
    assert (causal, scale, backends) == (backend == "flash", 0.125, backend)
    assert (bias is None) == (backend == "flash")
    # the backward reads our forward's out and canonical lse, the forward's inputs
    assert backward.args[1:4] == (q, k, v) and backward.args[6] is bias
    assert [a.args for a in backward.args[4:6]] == [(forward, 0), (forward, 1)]
    out, lse = forward.meta["val"]
    assert lse.shape == (2, 4, 256) and lse.dtype == torch.float32 and lse.is_contiguous()
    assert [t.shape for t in backward.meta["val"]] == [(2, 4, 256, 64)] * 3


@pytest.mark.parametrize("case", [
    Case(kv_heads=2),  # GQA: flash's K and V with fewer heads
    Case(kv_heads=2, repeat_kv=True),  # K and V repeated to the query's heads
    Case(backend="efficient", mask="bool", causal=False, seq=200),
    Case(backend="cudnn", mask="additive", causal=False),
    Case(backward=False),  # an inference graph: the forward alone
], ids=["gqa", "repeated-kv", "bool-mask", "additive-mask", "inference"])
def test_supported_cases_are_rewritten(case):
    gm, count = rewritten(case)
    assert count == 1
    assert targets(gm).count(SDPA_BACKWARD) == (1 if case.backward else 0)


@pytest.mark.parametrize("case, reason", [
    (Case(dropout=0.1), "dropout 0.1"),
    (Case(backend="efficient", mask="per_head", causal=False),
     "the mask is not broadcast over heads"),
    (Case(device="cpu"), "inputs on cpu, not CUDA"),
], ids=["dropout", "per-head-mask", "cpu"])
def test_unsupported_cases_are_left_with_the_reason(case, reason, caplog):
    with caplog.at_level(logging.INFO, logger=sdpa_pass.__name__):
        gm, count = rewritten(case)
    assert count == 0 and SDPA not in targets(gm)
    assert reason in caplog.text and "left to SDPA's backend" in caplog.text


def test_the_eligible_backends_are_torchs_checks_with_the_traced_one_first(monkeypatch):
    """A CPU torch admits no CUDA backend; as a CUDA torch would, cuDNN's check admits
    the inputs here and flash's refuses them (a mask)."""
    from torch.backends import cuda

    seen = []
    monkeypatch.setattr(cuda, "can_use_cudnn_attention",
                        lambda params, debug: seen.append(params) or True)
    monkeypatch.setattr(cuda, "can_use_flash_attention", lambda params, debug: True)
    gm, _ = rewritten(Case(backend="efficient", mask="additive", causal=False))
    assert call(gm, SDPA).args[-1] == "efficient,cudnn"
    assert len(seen) == 1  # flash is not asked: it takes no mask
    gm, _ = rewritten(Case())
    assert call(gm, SDPA).args[-1] == "flash,cudnn"


def test_a_check_that_fails_to_run_counts_as_ineligible(monkeypatch):
    from torch.backends import cuda

    def broken(params, debug):
        raise RuntimeError("no device")

    monkeypatch.setattr(cuda, "can_use_cudnn_attention", broken)
    gm, _ = rewritten(Case())
    assert call(gm, SDPA).args[-1] == "flash"


def test_the_pass_rewrites_only_with_the_knob_and_cutedsl_under_max_autotune_for_sm90(
        monkeypatch):
    def applied(max_autotune=True, backends="ATEN,TRITON,CUTEDSL"):
        gm, _, _ = trace(Case())
        with torch._inductor.config.patch(max_autotune=max_autotune,
                                          max_autotune_gemm_backends=backends):
            return sdpa_pass.SDPAChoicePass().apply(gm.graph)

    monkeypatch.setattr(config, "arch", "sm_90a")
    assert applied() == 0  # the knob is off by default
    monkeypatch.setattr(config, "sdpa", True)
    assert applied() == 1
    assert applied(backends="ATEN,TRITON") == 0  # a graph listing no CUTEDSL is Inductor's
    assert applied(max_autotune=False) == 0
    monkeypatch.setattr(config, "arch", "sm_100a")
    assert applied() == 0


def test_the_pass_is_one_of_inductors_joint_graph_passes_and_keys_nothing():
    """Installed once among the pattern passes, it adds no custom pass whose uuid would
    enter every graph's FX graph cache key."""
    passes = [p for p in joint_graph.pass_patterns if isinstance(p, sdpa_pass.SDPAChoicePass)]
    assert len(passes) == 1
    sdpa_pass.install_sdpa_pass()
    assert len([p for p in joint_graph.pass_patterns
                if isinstance(p, sdpa_pass.SDPAChoicePass)]) == 1
    inductor = torch._inductor.config
    assert not isinstance(inductor.joint_custom_pre_pass, sdpa_pass.SDPAChoicePass)
    assert not isinstance(inductor.joint_custom_post_pass, sdpa_pass.SDPAChoicePass)
