"""The FP8 SwiGLU (``config.fp8_swiglu``): torchao float8 SwiGLU MLPs traced on fake CUDA
tensors (the inference config, PerRow and tensorwise, and the training recipes' no-grad
forward), their post-grad graphs rewritten to ``cutedsl::scaled_swiglu_mm`` -- x's two
equal quantizations proven one and one kept -- and lowered on a virtual sm_90 to our
FP8 two-weight kernel, compiled GPU-less from the output code; the graphs left alone
(the knob off, a quantization of another x, an intermediate used again); the op's ATen
form on CPU."""

import contextlib
import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cutedsl_inductor import config
from cutedsl_inductor.inductor.scaled_swiglu import same_value, scaled_swiglu_mm
from cutedsl_inductor.template.caller import CuteDSLTemplateCaller
from tests.helpers import kernel_definitions, load_kernels, lowered, virtual_sm90_max_autotune

pytest.importorskip("cutlass")

BF16, E4M3 = torch.bfloat16, torch.float8_e4m3fn
M, D, H = 256, 512, 384
RECIPES = ["inference-rowwise", "inference-tensorwise", "training-rowwise",
           "training-tensorwise"]
OURS_ONLY = {"test_configs.autotune_choice_desc_regex": "sm90_gemm"}


class SwigluMLP(nn.Module):
    def __init__(self, gate_reused=False):
        super().__init__()
        self.w1, self.w3, self.w2 = (nn.Linear(i, o, bias=False, dtype=BF16)
                                     for i, o in ((D, H), (D, H), (H, D)))
        self.gate_reused = gate_reused

    def forward(self, x):
        gate = self.w1(x)
        out = self.w2(F.silu(gate) * self.w3(x))
        return (out, gate) if self.gate_reused else out


def float8_mlp(recipe, mode, **kwargs):
    """The MLP with fake CUDA weights (no grad: autograd cannot record fake CUDA tensors
    in a CPU build), converted by torchao as ``recipe`` says."""
    mlp = SwigluMLP(**kwargs)
    with mode:
        for linear in (mlp.w1, mlp.w3, mlp.w2):
            linear.weight = nn.Parameter(torch.empty(linear.weight.shape, device="cuda",
                                                     dtype=BF16), requires_grad=False)
        to_float8(mlp, recipe)
    return mlp


def to_float8(mlp, recipe):
    """``mlp`` converted by torchao as ``recipe`` ("inference-" or "training-", then
    "rowwise" or "tensorwise") says."""
    float8 = pytest.importorskip("torchao.float8")
    quantization = pytest.importorskip("torchao.quantization")
    kind, scaling = recipe.split("-")
    if kind == "training":
        float8.convert_to_float8_training(
            mlp, config=float8.Float8LinearConfig.from_recipe_name(scaling))
    else:
        granularity = (quantization.PerRow() if scaling == "rowwise"
                       else quantization.PerTensor())
        quantization.quantize_(mlp, quantization.Float8DynamicActivationFloat8WeightConfig(
            granularity=granularity))


@contextlib.contextmanager
def lowered_mlp(monkeypatch, recipe, **kwargs):
    """The MLP's forward traced, through the post-grad passes (ours among them) and
    lowered by Inductor on a virtual sm_90; yields the GraphLowering."""
    from torch._inductor.debug import DebugContext
    from torch._inductor.decomposition import select_decomp_table
    from torch._inductor.fx_passes.post_grad import post_grad_passes
    from torch._inductor.graph import GraphLowering
    from torch._inductor.virtualized import V
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    quant_api = pytest.importorskip("torchao.quantization.quant_api")
    # torchao asks the (absent) GPU whether it takes float8; the virtual one does
    monkeypatch.setattr(quant_api, "_check_hardware_support", lambda granularity: None)
    mode = FakeTensorMode()
    mlp = float8_mlp(recipe, mode, **kwargs)
    with mode:
        x = torch.empty(M, D, device="cuda", dtype=BF16)
    with torch.no_grad():
        gm = make_fx(mlp, decomposition_table=select_decomp_table(), tracing_mode="fake")(x)
    with V.set_fake_mode(mode):
        post_grad_passes(gm, is_inference=True)
    graph = GraphLowering(gm, example_inputs=[x])
    with V.set_graph_handler(graph), V.set_debug_handler(DebugContext()), \
            V.set_fake_mode(mode):
        graph.run(x)
        yield graph


@pytest.fixture
def fp8_swiglu(monkeypatch):
    """The knob on (and the FP8 GEMM, for w2's _scaled_mm); only our choices autotuned,
    each op's first (nothing can be timed without a GPU); yields the choice lists of
    the SwiGLU ops' autotunings."""
    from cutedsl_inductor.inductor import swiglu

    lists = []

    def select(name, choices, *args, **kwargs):
        lists.append(list(choices))
        return select.original(name, choices, *args, **kwargs)

    select.original = swiglu.autotune_select_algorithm
    monkeypatch.setattr(swiglu, "autotune_select_algorithm", select)
    with virtual_sm90_max_autotune(monkeypatch, "ATEN,CUTEDSL", gemm_max_configs=1), \
            config.patch(fp8_swiglu=True, fp8=True), torch._inductor.config.patch(OURS_ONLY):
        yield lists


def targets(graph):
    return [node.target for node in graph.graph.nodes if node.op == "call_function"]


@pytest.mark.parametrize("recipe", RECIPES)
def test_the_float8_mlps_swiglu_becomes_one_fp8_kernel_that_compiles(recipe, monkeypatch,
                                                                      fp8_swiglu):
    with lowered_mlp(monkeypatch, recipe) as graph:
        nodes = list(graph.graph.nodes)
    ops = [node.target for node in nodes]
    # the SwiGLU's two _scaled_mm are one op, w2's stays; x is quantized once (training:
    # each weight too), the hidden activation once
    assert ops.count(torch.ops.cutedsl.scaled_swiglu_mm.default) == 1
    assert ops.count(torch.ops.aten._scaled_mm.default) == 1
    casts = [n for n in nodes
             if n.target == torch.ops.prims.convert_element_type.default and n.args[1] == E4M3]
    assert len(casts) == (2 if recipe.startswith("inference") else 5)
    (fused,) = [n for n in nodes if n.target == torch.ops.cutedsl.scaled_swiglu_mm.default]
    assert fused.args[-1] == BF16
    (choices,) = fp8_swiglu
    ours = [c for c in choices if isinstance(c, CuteDSLTemplateCaller)]
    assert len(ours) == 1 and len(choices) == 2  # and the ATen fallback
    row = recipe.endswith("rowwise")
    assert ours[0].params["SWIGLU"] == "b" and ours[0].params["FP8"] is True
    assert [ours[0].params[f"SCALE_{s}"] for s in ("A", "B", "UP")] == (
        ["row", "col", "col"] if row else ["tensor"] * 3)
    assert ours[0].load().kernel_fn is not None  # compiled for sm_90a


@pytest.mark.parametrize("m", [M, 16])  # 16: swap-AB, the weights the kernel's A
def test_a_residual_fuses_into_the_fp8_swiglu_kernel(m, fp8_swiglu):
    """The op's output plus a bf16 residual: one kernel of ours, the residual added after
    the scaled SwiGLU (``epilogue_values`` of the fused subclass)."""
    def block(x, w1, w3, scale_x, scale_w1, scale_w3, residual):
        return torch.ops.cutedsl.scaled_swiglu_mm(x, w1.t(), w3.t(), scale_x, scale_w1.t(),
                                                  scale_w3.t(), BF16) + residual

    shapes = [(m, D), (H, D), (H, D), (m, 1), (H, 1), (H, 1), (m, H)]
    dtypes = [E4M3] * 3 + [torch.float32] * 3 + [BF16]
    with lowered(block, *shapes, dtype=dtypes) as graph:
        code = graph.codegen()[0].value
    (definition,) = kernel_definitions(code)
    source = definition.value.args[1].value
    assert "def epilogue_values(" in source and "_epilogue_apply(" in source
    assert "triton" not in code.split("async_compile.wait")[1]
    load_kernels([definition])


def test_the_knob_off_leaves_the_graph_alone(monkeypatch):
    with virtual_sm90_max_autotune(monkeypatch, "ATEN,CUTEDSL", gemm_max_configs=1), \
            lowered_mlp(monkeypatch, "inference-rowwise") as graph:
        ops = targets(graph)
    assert torch.ops.cutedsl.scaled_swiglu_mm.default not in ops
    assert ops.count(torch.ops.aten._scaled_mm.default) == 3


def test_a_training_graph_that_keeps_the_gate_stays_with_a_reason(monkeypatch, fp8_swiglu,
                                                                  caplog):
    with caplog.at_level(logging.DEBUG, logger="cutedsl_inductor"), \
            lowered_mlp(monkeypatch, "training-rowwise", gate_reused=True) as graph:
        ops = targets(graph)
    assert torch.ops.cutedsl.scaled_swiglu_mm.default not in ops
    assert ops.count(torch.ops.aten._scaled_mm.default) == 3
    assert "use outside the pattern" in caplog.text


def quantized(x):
    """torchao's tensorwise cast of x: (x * 448 / amax(|x|)).clamp().to(e4m3), its scale."""
    scale = 448.0 / x.abs().max().float()
    return (x.float() * scale).clamp(-448.0, 448.0).to(E4M3), scale.reciprocal()


def proof_graph(fn):
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn)(*(torch.randn(64, 64, dtype=BF16) for _ in range(2))).graph


def test_equal_quantizations_are_one_value_and_others_are_not():
    """Node by node: the same ops on the same input are one value; another input, another
    constant, a random op are not."""
    def outputs(graph):
        (out,) = [n for n in graph.nodes if n.op == "output"]
        return out.args[0]

    same = outputs(proof_graph(lambda x, y: (*quantized(x), *quantized(x))))
    assert same_value(same[0], same[2], {}) and same_value(same[1], same[3], {})
    other = outputs(proof_graph(lambda x, y: (*quantized(x), *quantized(y))))
    assert not same_value(other[0], other[2], {})
    clamp = outputs(proof_graph(lambda x, y: (x.float().clamp(-448.0, 448.0),
                                              x.float().clamp(-448.0, 440.0))))
    assert not same_value(clamp[0], clamp[1], {})
    noisy = outputs(proof_graph(lambda x, y: (x + torch.rand_like(x), x + torch.rand_like(x))))
    assert not same_value(noisy[0], noisy[1], {})


@pytest.mark.parametrize("scaling", ["tensorwise", "rowwise"])
def test_the_ops_aten_form_is_silu_of_one_scaled_mm_times_the_other(scaling):
    torch.manual_seed(0)
    x = torch.randn(64, 128).to(E4M3)
    w1, w3 = (torch.randn(96, 128).to(E4M3) for _ in range(2))
    if scaling == "rowwise":
        sx, s1, s3 = torch.rand(64, 1) + 0.5, torch.rand(1, 96) + 0.5, torch.rand(1, 96) + 0.5
    else:
        sx, s1, s3 = (torch.rand(()) + 0.5 for _ in range(3))
    try:
        out = scaled_swiglu_mm(x, w1.t(), w3.t(), sx, s1, s3, BF16)
    except (RuntimeError, NotImplementedError) as err:
        pytest.skip(f"this torch has no CPU _scaled_mm: {err}")
    gate = torch._scaled_mm(x, w1.t(), sx, s1, out_dtype=BF16, use_fast_accum=True)
    up = torch._scaled_mm(x, w3.t(), sx, s3, out_dtype=BF16, use_fast_accum=True)
    assert out.dtype == BF16 and torch.equal(out, F.silu(gate) * up)
    reference = F.silu(sx * (x.float() @ w1.float().t()) * s1) * (
        sx * (x.float() @ w3.float().t()) * s3)
    torch.testing.assert_close(out.float(), reference, rtol=2e-2, atol=2e-2)
