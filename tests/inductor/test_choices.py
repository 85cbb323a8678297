"""The GEMM choices hook, driven through Inductor's own KernelInputs (GPU-less)."""

import pytest
import sympy
import torch
from torch._inductor import config as inductor_config
from torch._inductor.kernel_inputs import MMKernelInputs

from cutedsl_inductor.inductor.choices import CuteDSLChoices
from tests.helpers import make_input

ENABLED = dict(max_autotune=True, max_autotune_gemm_backends="ATEN,TRITON,CUTEDSL")


def offered(op, nodes, scalars=None, **patch):
    inputs = MMKernelInputs(nodes, scalars=scalars)
    with inductor_config.patch(**{**ENABLED, **patch}):
        return [c for c in CuteDSLChoices().get_template_configs(inputs, [], op)
                if type(c).__name__ == "CuteDSLTemplateCaller"]


def test_mm_gets_choices_once_per_lowering(graph):
    nodes = [make_input(graph, "a", (512, 256), torch.bfloat16),
             make_input(graph, "b", (256, 384), torch.bfloat16)]
    first = offered("mm", nodes)
    assert 1 <= len(first) <= 8
    assert all(c.template.name == "sm90_gemm" for c in first)
    assert offered("mm", nodes) == []


def test_a_runtime_m_keeps_its_choices(graph):
    m = sympy.Symbol("s0", integer=True, positive=True)
    graph.sizevars.shape_env.var_to_val[m] = sympy.Integer(1000)  # its hint, as dynamo gives
    nodes = [make_input(graph, "a", (m, 256), torch.bfloat16),
             make_input(graph, "b", (256, 384), torch.bfloat16)]
    assert offered("mm", nodes)


def test_transposed_weight_and_bmm(graph):
    w_t = make_input(graph, "w", (256, 384), torch.float16, stride=(1, 256))
    assert offered("mm", [make_input(graph, "x", (100, 256), torch.float16), w_t])
    a3 = make_input(graph, "a3", (4, 64, 128), torch.bfloat16)
    b3 = make_input(graph, "b3", (4, 128, 64), torch.bfloat16)
    assert offered("bmm", [a3, b3])


def test_addmm_carries_alpha_beta_and_waits_for_the_expanded_bias(graph):
    a = make_input(graph, "a", (128, 256), torch.bfloat16)
    b = make_input(graph, "b", (256, 512), torch.bfloat16)
    bias_1d = make_input(graph, "bias", (512,), torch.bfloat16)
    assert offered("addmm", [bias_1d, a, b], dict(alpha=2.0, beta=0.5)) == []
    bias = make_input(graph, "bias2", (128, 512), torch.bfloat16, stride=(0, 1))
    (choice, *_) = offered("addmm", [bias, a, b], dict(alpha=2.0, beta=0.5))
    assert choice.params["ALPHA"] == 2.0 and choice.params["BETA"] == 0.5
    assert choice.params["HAS_BIAS"] is True


def test_addmm_with_an_unaligned_bias_keeps_its_choices(graph):
    """TMA reads A and B only; the bias (here a view one element into its storage) goes
    through plain loads whose declared alignment is the element's."""
    a = make_input(graph, "a", (128, 256), torch.bfloat16)
    b = make_input(graph, "b", (256, 512), torch.bfloat16)
    bias = make_input(graph, "bias", (128, 512), torch.bfloat16, stride=(513, 1), offset=1)
    assert offered("addmm", [bias, a, b], dict(alpha=1.0, beta=1.0))
    a_view = make_input(graph, "a_view", (128, 256), torch.bfloat16, offset=1)
    assert offered("addmm", [bias, a_view, b], dict(alpha=1.0, beta=1.0)) == []


@pytest.mark.parametrize("reason", ["backend off", "no max-autotune", "fp32", "mixed",
                                    "misaligned", "no unit stride", "other arch",
                                    "runtime stride"])
def test_no_choice_when_it_does_not_fit(graph, reason, monkeypatch):
    from cutedsl_inductor import config

    dtype_a = dtype_b = torch.bfloat16
    patch, shape_b, stride_b = {}, (256, 384), None
    if reason == "backend off":
        patch = dict(max_autotune_gemm_backends="ATEN,TRITON")
    elif reason == "no max-autotune":
        patch = dict(max_autotune=False)
    elif reason == "fp32":
        dtype_a = dtype_b = torch.float32
    elif reason == "mixed":
        dtype_b = torch.float16
    elif reason == "misaligned":
        shape_b, stride_b = (256, 383), None
    elif reason == "no unit stride":
        stride_b = (768, 2)
    elif reason == "runtime stride":  # dynamic K: a later call may bring an odd one
        k = sympy.Symbol("s0", integer=True, positive=True)
        nodes = [make_input(graph, "a", (512, k), dtype_a),
                 make_input(graph, "b", (k, 384), dtype_b, stride=(1, k))]
        assert offered("mm", nodes) == []
        return
    else:
        monkeypatch.setattr(config, "arch", "sm_100a")
    nodes = [make_input(graph, "a", (512, 256), dtype_a),
             make_input(graph, "b", shape_b, dtype_b, stride=stride_b)]
    assert offered("mm", nodes, **patch) == []


WITHOUT_CUTE_DSL = """
import sys
sys.modules["cutlass"] = None  # nvidia-cutlass-dsl not installed: importing it fails
import torch
from torch._inductor import config as inductor_config
from torch._inductor.kernel_inputs import MMKernelInputs
from torch._inductor.graph import GraphLowering
from torch._inductor.virtualized import V
from cutedsl_inductor.inductor.choices import CuteDSLChoices
from tests.helpers import make_input

with V.set_graph_handler(GraphLowering(torch.fx.symbolic_trace(lambda x: x))):
    graph = V.graph
    nodes = [make_input(graph, "a", (512, 256), torch.bfloat16),
             make_input(graph, "b", (256, 384), torch.bfloat16)]
    with inductor_config.patch(max_autotune=True, max_autotune_gemm_backends="CUTEDSL"):
        for _ in range(2):
            print(len(CuteDSLChoices().get_template_configs(MMKernelInputs(nodes), [], "mm")))
"""


def test_without_cute_dsl_no_choice_is_offered_and_one_warning_says_why():
    import subprocess
    import sys
    from pathlib import Path

    run = subprocess.run([sys.executable, "-c", WITHOUT_CUTE_DSL], capture_output=True,
                         text=True, cwd=Path(__file__).parents[2], timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["0", "0"]
    assert run.stderr.count("CuTe DSL cannot be imported") == 1, run.stderr


def test_under_the_cpp_wrapper_no_choice_is_offered_and_codegen_works(monkeypatch, caplog):
    """Without ``config.aot`` Inductor's C++ wrapper gets no choice of ours: ATen serves
    the mm and a warning says why (with it: tests/inductor/test_cpp_launch.py)."""
    from cutedsl_inductor.inductor import choices
    from tests.helpers import lowered, use_virtual_sm90

    use_virtual_sm90(monkeypatch)
    monkeypatch.setattr(choices, "_warn_once", choices._warn_once.__wrapped__)
    with inductor_config.patch(max_autotune=True, max_autotune_gemm_backends="ATEN,CUTEDSL",
                               cpp_wrapper=True), \
            lowered(lambda x, w: x @ w.t(), (256, 512), (384, 512), cpp_wrapper=True) as graph:
        code = graph.codegen()[0].value
    assert "cutedsl" not in code
    assert "launches CuteDSL kernels only with cutedsl_inductor.config.aot" in caplog.text
