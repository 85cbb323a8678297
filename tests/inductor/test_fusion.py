"""Epilogue fusion through Inductor's own lowering, scheduler and wrapper codegen, on a
virtual sm_90 device (CPU): the blocks of the epilogue issue come out as CuteDSL GEMMs
with their consumers inside, and the fused kernels in the output code compile GPU-less."""

import ast

import pytest
import torch
import torch.nn.functional as F
from torch._inductor import ir
from torch._inductor.scheduler import Scheduler

from cutedsl_inductor import config
from cutedsl_inductor import counters
from cutedsl_inductor.inductor.scheduling import is_cutedsl_template
from cutedsl_inductor.template.caller import CuteDSLTemplateCaller
from tests.helpers import (
    kernel_definitions,
    load_kernels,
    lowered,
    use_virtual_sm90,
    virtual_sm90_max_autotune,
)

BLOCKS = {
    "gelu_bias": (lambda x, w, b: F.gelu(x @ w.t() + b), [(256, 512), (384, 512), (384,)]),
    "relu_addmm_scale_residual": (
        lambda x, w, b, r: torch.relu(torch.addmm(b, x, w.t())) * 0.5 + r,
        [(256, 512), (384, 512), (384,), (256, 384)]),
    "swiglu": (lambda x, w1, w3: F.silu(x @ w1.t()) * (x @ w3.t()),
               [(256, 512), (384, 512), (384, 512)]),
}


@pytest.fixture
def max_autotune(monkeypatch):
    with virtual_sm90_max_autotune(monkeypatch, "CUTEDSL", gemm_max_configs=1):
        yield


@pytest.mark.parametrize("block", sorted(BLOCKS))
def test_block_fuses_into_the_gemm_and_its_kernels_compile(block, max_autotune):
    fn, shapes = BLOCKS[block]
    with lowered(fn, *shapes) as graph:
        code = graph.codegen()[0].value
    calls = code.split("async_compile.wait")[1]
    assert "triton" not in calls, "a consumer stayed a separate kernel"
    definitions = kernel_definitions(code)
    assert len(definitions) == (2 if block == "swiglu" else 1)
    fused = [d for d in definitions if "_epilogue(" in ast.unparse(d)]
    assert len(fused) == 1
    compiled_while_fusing = counters.kernels.compiled
    load_kernels(fused)
    # the scheduler compiled the fused kernel before fusing; the output code reuses it
    assert compiled_while_fusing >= 1 and counters.kernels.compiled == compiled_while_fusing
    assert counters.kernels.memory_hits >= 1


def test_fusion_is_off_unless_configured(max_autotune):
    fn, shapes = BLOCKS["gelu_bias"]
    with config.patch(epilogue_fusion=False), lowered(fn, *shapes) as graph:
        nodes = Scheduler(graph.operations).nodes
    assert [is_cutedsl_template(n) for n in nodes] == [True, False]


def deferred_choice(graph):
    (multi,) = [b for b in graph.buffers if isinstance(b, ir.MultiTemplateBuffer)]
    return multi


@pytest.mark.parametrize("ours_ms, aten_ms, takes_ours", [
    (1.0, 2.0, True),  # ours is fastest
    (2.0, 1.0, False),  # ATen is much faster
    (1.001, 1.0, True),  # ATen is faster by less than the fusion saves
])
def test_deferred_choice_fuses_when_ours_wins(ours_ms, aten_ms, takes_ours, max_autotune):
    fn, shapes = BLOCKS["gelu_bias"]
    with torch._inductor.config.patch(max_autotune_gemm_backends="ATEN,CUTEDSL"), \
            config.patch(gemm_max_configs=2), lowered(fn, *shapes) as graph:
        multi = deferred_choice(graph)
        ours = [c for c in multi.choices if isinstance(c, CuteDSLTemplateCaller)]
        # what benchmarking would have measured
        multi._choice_timings[None] = {
            c: (ours_ms if c is ours[1] else 9.0) if c in ours else aten_ms
            for c in multi.choices}
        # (Inductor's own epilogue benchmarking of the deferred choice needs Triton)
        with torch._inductor.config.patch(epilogue_fusion=takes_ours):
            nodes = Scheduler(graph.operations).nodes
    if takes_ours:
        (node,) = nodes
        template, consumer = node.get_nodes()
        assert is_cutedsl_template(template) and template.node.params == ours[1].params
    else:
        assert not any(is_cutedsl_template(n) for node in nodes for n in node.get_nodes())


def test_the_fused_kernel_follows_the_choice_put_on_the_buffer(max_autotune):
    """Retiming with the epilogue swaps our choices on the finalized buffer: the fused
    kernel it renders (and compiles, GPU-less) is the chosen config's."""
    from cutedsl_inductor.inductor.multi_template import use_choice
    from cutedsl_inductor.inductor.scheduling import CuteDSLScheduling, render_kernel

    fn, shapes = BLOCKS["gelu_bias"]
    with torch._inductor.config.patch(max_autotune_gemm_backends="CUTEDSL"), \
            config.patch(gemm_max_configs=2), lowered(fn, *shapes) as graph:
        multi = deferred_choice(graph)
        first, second = multi.choices
        multi._choice_timings[None] = {first: 1.0, second: 1.1}
        scheduler = Scheduler(graph.operations)
        (node,) = scheduler.nodes
        template, consumer = node.get_nodes()
        assert template.node.params == first.params
        use_choice(template.node, second)
        plan = CuteDSLScheduling(scheduler).epilogue_plan([template, consumer])
        source = render_kernel(template.node, plan)[1].source
    assert plan is not None and "_epilogue(" in source
    for name, value in second.params.items():
        assert f"{name}: cutlass.Constexpr = {value!r}" in source


def test_a_fused_kernel_that_does_not_compile_stays_unfused(graph, monkeypatch, caplog):
    """The autotuner compiled the template alone; the fusion compiles the fused kernel
    first, and a template bug there leaves the consumer as a kernel of its own."""
    from torch._inductor.lowering import lowerings

    from cutedsl_inductor.kernels.elementwise import ADD_SOURCE
    from cutedsl_inductor.template.template import CuteDSLTemplate
    from tests.helpers import make_input, make_layout

    use_virtual_sm90(monkeypatch)
    broken = CuteDSLTemplate("broken_epilogue_add", ADD_SOURCE.replace(
        "{% for d in range(output_rank)|reverse %}", "extras, {% for d in range(output_rank)|reverse %}"))
    a, b = make_input(graph, "a", (64, 128)), make_input(graph, "b", (64, 128))
    choice = broken.generate(input_nodes=[a, b], layout=make_layout((64, 128)),
                             THREADS=128, VECTOR=4)
    out = choice.output_node()
    out.realize()
    relu = lowerings[torch.ops.aten.relu.default](out)
    relu.realize()
    graph.graph_outputs = [relu]
    from torch._inductor.debug import DebugContext
    from torch._inductor.virtualized import V

    with config.patch(epilogue_fusion=True), caplog.at_level("WARNING"), \
            V.set_debug_handler(DebugContext()):
        nodes = Scheduler(graph.operations).nodes
    assert [is_cutedsl_template(n) for n in nodes] == [True, False]
    assert "not fusing an epilogue into cutedsl_broken_epilogue_add_" in caplog.text
    assert "broken_epilogue_add" in caplog.text and ".py" in caplog.text  # template, file


def test_the_fastest_ping_pong_choice_is_among_those_timed_with_the_epilogue(graph):
    from cutedsl_inductor.inductor.multi_template import retime_candidates
    from cutedsl_inductor.kernels.gemm.template import gemm_choices
    from tests.helpers import make_input, make_layout

    x = make_input(graph, "x", (8192, 4096), torch.bfloat16)
    w_t = make_input(graph, "w", (4096, 4096), torch.bfloat16, stride=(1, 4096))
    ours = []  # in the heuristic's order, standing in for plain timings
    gemm_choices(ours, "mm", [x, w_t], make_layout((8192, 4096), torch.bfloat16))
    kinds = ["pp" if c.params["PINGPONG"] else "other" for c in ours]
    assert kinds[:3] == ["other"] * 3 and "pp" in kinds  # the case that needs it
    first_pingpong = ours[kinds.index("pp")]
    assert retime_candidates(ours, 3) == ours[:2] + [first_pingpong]
    assert retime_candidates(ours, 1) == ours[:1]
    cooperative_only = [c for c in ours if not c.params["PINGPONG"]]
    assert retime_candidates(cooperative_only, 3) == cooperative_only[:3]
