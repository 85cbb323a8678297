"""Prologue fusion through Inductor's own lowering, scheduler and wrapper codegen, on a
virtual sm_90 device (CPU): a pointwise producer of the activation comes out inside our
GEMM (its transform_a variant, the producer's source loaded in its place), what the
kernel cannot take stays a kernel of its own, and the fused kernels compile GPU-less."""

import ast
import logging

import pytest
import torch
from torch._inductor.scheduler import Scheduler

from cutedsl_inductor import config
from cutedsl_inductor.inductor.scheduling import is_cutedsl_template
from tests.helpers import kernel_definitions, load_kernels, lowered, virtual_sm90_max_autotune

BF16, FP32 = torch.bfloat16, torch.float32

# the activation's producer casts (scales, multiplies by RMSNorm's weight, adds) to the
# bf16 weight's dtype: (fn, shapes, dtypes)
BLOCKS = {
    "cast": (lambda x, w: x.to(BF16) @ w.t(), [(1024, 512), (1024, 512)], [FP32, BF16]),
    "scale": (lambda x, w: (x * 0.125).to(BF16) @ w.t(), [(1024, 512), (1024, 512)],
              [FP32, BF16]),
    "rmsnorm_weight": (lambda x, g, w: (x * g).to(BF16) @ w.t(),
                       [(1000, 512), (512,), (1024, 512)], [FP32, FP32, BF16]),
    "bf16_add": (lambda x, y, w: (x + y) @ w.t(), [(1024, 512), (1024, 512), (1024, 512)],
                 [BF16, BF16, BF16]),
    "bmm": (lambda x, w: torch.bmm(x.to(BF16), w), [(4, 1024, 256), (4, 256, 1024)],
            [FP32, BF16]),
}


@pytest.fixture
def max_autotune(monkeypatch):
    with virtual_sm90_max_autotune(monkeypatch, "CUTEDSL", gemm_max_configs=1), \
            config.patch(epilogue_fusion=False, prologue_fusion=True):
        yield


def fused_sources(code):
    return [ast.unparse(d) for d in kernel_definitions(code)]


@pytest.mark.parametrize("block", sorted(BLOCKS))
def test_the_activations_producer_fuses_into_the_gemm_and_compiles(block, max_autotune):
    fn, shapes, dtypes = BLOCKS[block]
    with lowered(fn, *shapes, dtype=dtypes) as graph:
        code = graph.codegen()[0].value
    (source,) = fused_sources(code)
    assert "transform_a=True" in source and "_prologue(value, " in source
    calls = code.split("async_compile.wait")[1]
    assert calls.count(".run(") == 1 and "triton" not in calls, calls
    compiled_while_fusing = compiler_stats()["compiled"]
    load_kernels(kernel_definitions(code))
    assert compiled_while_fusing >= 1 and compiler_stats()["compiled"] == compiled_while_fusing


def compiler_stats():
    from cutedsl_inductor import counters

    return counters.snapshot()["kernels"]


def test_the_rmsnorm_weight_is_read_by_k_and_the_source_replaces_the_input(max_autotune):
    fn, shapes, dtypes = BLOCKS["rmsnorm_weight"]
    with lowered(fn, *shapes, dtype=dtypes) as graph:
        code = graph.codegen()[0].value
    (source,) = fused_sources(code)
    prologue = source[source.index("_prologue(value, c0, c1, extras):"):]
    prologue = prologue[:prologue.index("return")]
    assert "extras[0][c1]" in prologue  # g, indexed by the K coordinate
    # RMSNorm's cast to bf16 before the weight computes in fp32, as Inductor's Triton does
    assert "value" in prologue and "BFloat16" not in prologue
    assert "pro_args=(cute.make_tensor(" in source


def test_nothing_fuses_unless_configured(max_autotune):
    fn, shapes, dtypes = BLOCKS["cast"]
    for switch in (config.patch(prologue_fusion=False),
                   torch._inductor.config.patch(prologue_fusion=False)):
        with switch, lowered(fn, *shapes, dtype=dtypes) as graph:
            nodes = Scheduler(graph.operations).nodes
        assert [is_cutedsl_template(n) for n in nodes] == [False, True]


@pytest.mark.parametrize("fn, w_shape, dtypes, why", [
    # the source is read at another element (a flip): nothing to load in its place
    (lambda x, w: torch.flip(x, [1]).to(BF16) @ w.t(), (1024, 512), [FP32, BF16],
     "reads no tensor"),
    # sin does not translate
    (lambda x, w: torch.sin(x).to(BF16) @ w.t(), (1024, 512), [FP32, BF16], "sin"),
    # the producer writes B, which the kernel does not transform
    (lambda x, w: x @ w.to(BF16), (512, 1024), [BF16, FP32], "transforms no input 'b'"),
])
def test_what_the_kernel_cannot_take_stays_unfused(fn, w_shape, dtypes, why, max_autotune,
                                                   caplog):
    with caplog.at_level(logging.DEBUG, logger="cutedsl_inductor.inductor.scheduling"), \
            lowered(fn, (1024, 512), w_shape, dtype=dtypes) as graph:
        nodes = Scheduler(graph.operations).nodes
    templates = [n for node in nodes for n in node.get_nodes() if is_cutedsl_template(n)]
    assert templates and all(t.node.prologue is None for t in templates)
    assert why in caplog.text


def test_a_swap_ab_choice_claims_no_prologue(monkeypatch, caplog):
    """At M <= 32 the heuristic's first config is swap-AB, where torch's a is the kernel's
    B: the choice renders no def_prologue, so the producer stays a kernel of its own."""
    with virtual_sm90_max_autotune(monkeypatch, "CUTEDSL", gemm_max_configs=1), \
            config.patch(prologue_fusion=True), \
            caplog.at_level(logging.DEBUG, logger="cutedsl_inductor.inductor.scheduling"), \
            lowered(BLOCKS["cast"][0], (16, 512), (1024, 512), dtype=[FP32, BF16]) as graph:
        nodes = Scheduler(graph.operations).nodes
    (template,) = [n for node in nodes for n in node.get_nodes() if is_cutedsl_template(n)]
    assert template.node.params.get("SWAP_AB") and template.node.prologue is None
    assert "transforms no input 'a'" in caplog.text
