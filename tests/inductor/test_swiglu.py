"""The SwiGLU rewrite: Inductor's post-grad graph of ``silu(x @ w1.t()) * (x @ w3.t())``
becomes one two-weight CuteDSL GEMM (lowered and compiled GPU-less on a virtual sm_90),
and every graph the kernel cannot serve stays as it was."""

import ast

import pytest
import torch
import torch.nn.functional as F

from cutedsl_inductor import config
from cutedsl_inductor.inductor.swiglu_pass import rewrite_swiglu
from tests.helpers import (
    kernel_definitions,
    load_kernels,
    lowered,
    virtual_sm90_max_autotune,
)


def swiglu(x, w1, w3):
    return F.silu(x @ w1.t()) * (x @ w3.t())


@pytest.fixture
def max_autotune(monkeypatch):
    """Our GEMMs under max-autotune on a virtual sm_90, one config per GEMM."""
    with virtual_sm90_max_autotune(monkeypatch, "ATEN,CUTEDSL", gemm_max_configs=1):
        yield


# Nothing can be benchmarked here: Inductor's test filter leaves only our kernel's choice
# of the SwiGLU lowering, whose ATen fallback it drops.
OURS_ONLY = {"test_configs.autotune_choice_desc_regex": "sm90_gemm"}


def mm_count(graph):
    return sum(node.target == torch.ops.aten.mm.default for node in graph.graph.nodes)


@pytest.mark.parametrize("x_shape,up_weight", [((256, 512), "mB_up="),
                                                ((2, 96, 512), "mB_up="),
                                                ((16, 512), "mA_up=")],
                         ids=["2d", "3d", "decode swap-AB"])
def test_swiglu_becomes_one_two_weight_gemm_that_compiles(x_shape, up_weight, max_autotune):
    with torch._inductor.config.patch(OURS_ONLY), \
            lowered(swiglu, x_shape, (384, 512), (384, 512), post_grad=True) as graph:
        code = graph.codegen()[0].value
    (definition,) = kernel_definitions(code)
    source = ast.unparse(definition)
    assert "swiglu=SWIGLU" in source and up_weight in source
    calls = code.split("async_compile.wait")[1]
    assert "triton" not in calls and "extern_kernels.mm" not in calls
    namespace = load_kernels([definition])
    name = definition.targets[0].id
    assert namespace[name].kernel_fn is not None


def gate_reused(x, w1, w3):
    gate = x @ w1.t()
    return F.silu(gate) * (x @ w3.t()), gate


@pytest.mark.parametrize("case", ["gate reused", "other x", "fp32", "fusion off",
                                  "plain product"])
def test_graphs_the_kernel_cannot_serve_keep_both_mms(case, max_autotune):
    fn, dtype = swiglu, torch.bfloat16
    shapes = [(256, 512), (384, 512), (384, 512)]
    if case == "gate reused":
        fn = gate_reused
    elif case == "other x":
        fn = lambda x, w1, w3: F.silu(x @ w1.t()) * ((x + 1) @ w3.t())  # noqa: E731
    elif case == "fp32":
        dtype = torch.float32
    elif case == "plain product":
        fn = lambda x, w1, w3: (x @ w1.t()) * (x @ w3.t())  # noqa: E731
    with config.patch(epilogue_fusion=case != "fusion off"):
        with lowered(fn, *shapes, dtype=dtype, post_grad=True) as graph:
            assert "cutedsl.swiglu_mm" not in str(graph.graph)
            assert mm_count(graph) >= 2


def test_rewrite_leaves_no_dead_nodes_and_keeps_the_output_shape(max_autotune):
    with lowered(swiglu, (2, 96, 512), (384, 512), (384, 512)) as graph:
        gm_graph = graph.graph
        assert rewrite_swiglu(gm_graph) == 1
        targets = [node.target for node in gm_graph.nodes if node.op == "call_function"]
        assert torch.ops.aten.mm.default not in targets
        assert torch.ops.cutedsl.swiglu_mm.default in targets
        (output,) = [node for node in gm_graph.nodes if node.op == "output"]
        assert output.args[0].meta["val"].shape == (2, 96, 384)


def test_lowering_decomposes_where_no_choice_fits(max_autotune):
    """K = 100 bf16 rows are not 16-byte aligned (TMA): no two-weight choice, so the
    lowering falls back to Inductor's own mms (ATen here) and pointwise ops."""
    from torch._inductor import ir

    with lowered(swiglu, (256, 100), (384, 100), (384, 100), post_grad=True) as graph:
        assert "cutedsl.swiglu_mm" in str(graph.graph)
        kernels = [getattr(op, "python_kernel_name", None) for op in graph.operations
                   if isinstance(op, ir.ExternKernel)]
        templates = [op for op in graph.operations if isinstance(op, ir.TemplateBuffer)]
    assert kernels == ["extern_kernels.mm", "extern_kernels.mm"]
    assert templates == []


def test_lowering_decomposes_where_the_aten_fallback_wins(max_autotune):
    """Inductor's filter leaves the SwiGLU lowering its ATen fallback alone, so that it
    wins, and each mm its ATen choice: the pattern is lowered as Inductor would (two mms,
    silu and the multiply in pointwise nodes), and the scheduler drops the fallback's
    unused node."""
    from torch._inductor import ir
    from torch._inductor.scheduler import Scheduler

    with torch._inductor.config.patch({"test_configs.autotune_choice_desc_regex": "^$"}), \
            lowered(swiglu, (256, 512), (384, 512), (384, 512), post_grad=True) as graph:
        assert "cutedsl.swiglu_mm" in str(graph.graph)
        nodes = [n for node in Scheduler(graph.operations).nodes for n in node.get_nodes()]
    externs = [n.node.python_kernel_name for n in nodes if isinstance(n.node, ir.ExternKernel)]
    assert externs == ["extern_kernels.mm", "extern_kernels.mm"]
    assert len(nodes) > len(externs)  # the pointwise ops
