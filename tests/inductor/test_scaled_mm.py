"""Our FP8 GEMM in Inductor's ``torch._scaled_mm`` lowering, on a virtual sm_90 (CPU):
offered next to ATen's choice for tensorwise and rowwise scales (with a bias, a dynamic
M, swap-AB at small M), its kernels compiled GPU-less from the output code, fused
epilogues, and the problems it refuses with a reason."""

import ast
import logging
import re

import pytest
import sympy
import torch
import torch.nn.functional as F

from cutedsl_inductor import config
from cutedsl_inductor.inductor.scaled_mm import OP_NAME
from cutedsl_inductor.inductor.scheduling import is_cutedsl_template
from cutedsl_inductor.template.caller import CuteDSLTemplateCaller
from tests.helpers import (
    kernel_definitions,
    load_kernels,
    lowered,
    make_input,
    make_layout,
    virtual_sm90_max_autotune,
)

pytest.importorskip("cutlass")

E4M3, BF16, F32 = torch.float8_e4m3fn, torch.bfloat16, torch.float32
M, N, K = 256, 384, 512


def scaled_mm(a, w, scale_a, scale_b, *bias, out_dtype=BF16, use_fast_accum=True):
    """torch's ``a @ w.t()`` in FP8: ``w`` an (N, K) weight, so B is column-major."""
    return torch._scaled_mm(a, w.t(), scale_a, scale_b, *bias, out_dtype=out_dtype,
                            use_fast_accum=use_fast_accum)


def shapes_for(kind, m=M, bias=False):
    scales = [(), ()] if kind == "tensorwise" else [(m, 1), (1, N)]
    shapes = [(m, K), (N, K), *scales] + ([(N,)] if bias else [])
    return shapes, [E4M3, E4M3, F32, F32] + ([BF16] if bias else [])


@pytest.fixture
def fp8_on(monkeypatch):
    with virtual_sm90_max_autotune(monkeypatch, "ATEN,CUTEDSL", gemm_max_configs=2), \
            config.patch(fp8=True):
        yield


@pytest.fixture
def offered(monkeypatch):
    """The choices each ``scaled_mm`` autotuning was given (Inductor's select then runs
    on the first of ours alone, or ATen's: nothing can be timed without a GPU)."""
    from torch._inductor.kernel import mm

    lists = []

    def select(name, choices, *args, **kwargs):
        if name == OP_NAME:
            lists.append(list(choices))
            ours = [c for c in choices if isinstance(c, CuteDSLTemplateCaller)]
            choices = ours[:1] or choices[:1]
        return select.original(name, choices, *args, **kwargs)

    select.original = mm.autotune_select_algorithm
    monkeypatch.setattr(mm, "autotune_select_algorithm", select)
    return lists


def ours(choices):
    return [c for c in choices if isinstance(c, CuteDSLTemplateCaller)]


@pytest.mark.parametrize("kind,bias,m", [("tensorwise", False, M), ("rowwise", True, M),
                                         ("rowwise", False, 16)])
def test_our_choice_joins_atens_and_its_kernel_compiles(kind, bias, m, fp8_on, offered):
    shapes, dtypes = shapes_for(kind, m, bias)
    with lowered(scaled_mm, *shapes, dtype=dtypes) as graph:
        code = graph.codegen()[0].value
    (choices,) = offered
    assert any("_scaled_mm" in (c.name or "") for c in choices if c not in ours(choices))
    (first, *_) = ours(choices)
    scales = ("tensor", "tensor") if kind == "tensorwise" else ("row", "col")
    assert (first.params["SCALE_A"], first.params["SCALE_B"]) == scales
    assert first.params["FP8"] is True and first.params["TILE_K"] == 128
    assert first.params["HAS_BIAS"] == bias and first.params["BETA"] == 1.0
    assert ("SWAP_AB" in first.params) == (m <= 32)
    definitions = kernel_definitions(code)
    assert len(definitions) == 1 and "cutedsl_sm90_gemm" in code.split("def call")[1]
    load_kernels(definitions)  # compiled for sm_90a from the output code


def test_a_fused_activation_and_residual_compile_in_the_fp8_kernel(fp8_on, offered):
    def block(a, w, scale_a, scale_b, residual):
        return F.silu(scaled_mm(a, w, scale_a, scale_b)) + residual

    m = 2048  # whose first config is unsplit: the residual can come by TMA
    shapes, dtypes = shapes_for("rowwise", m)
    with lowered(block, *shapes, (m, N), dtype=dtypes + [BF16]) as graph:
        code = graph.codegen()[0].value
    (definition,) = kernel_definitions(code)
    assert "_epilogue_apply(" in code and "mTile=" in code
    assert "triton" not in code.split("async_compile.wait")[1]
    load_kernels([definition])


def test_relu_residual_and_the_cast_to_the_next_layers_dtype_fuse(fp8_on, offered):
    """An fp32 _scaled_mm, relu, a bf16 residual, the cast to bf16 for the next layer:
    one kernel, which stores bf16."""
    def block(a, w, scale_a, scale_b, residual):
        out = scaled_mm(a, w, scale_a, scale_b, out_dtype=F32)
        return (torch.relu(out) + residual).to(BF16)

    shapes, dtypes = shapes_for("tensorwise")
    with lowered(block, *shapes, (M, N), dtype=dtypes + [BF16]) as graph:
        code = graph.codegen()[0].value
    (definition,) = kernel_definitions(code)
    source = definition.value.args[1].value
    assert "cute.math.max(" in source and "_epilogue_apply(" in source
    assert spec_dtypes(definition) == ["float8_e4m3fn"] * 2 + ["float32"] * 2 + [
        "bfloat16", "bfloat16"]  # a, b, the scales, the residual, the fused output
    assert "triton" not in code.split("async_compile.wait")[1]
    load_kernels([definition])


def spec_dtypes(definition):
    """The dtypes of a kernel definition's argument specs, in order."""
    return re.findall(r"dtype='(\w+)'", ast.unparse(definition.value.keywords[0]))


def quantize_next(y, scale):
    """torchao's float8 cast of the next layer's input with a scale the graph holds (a
    static one): ``clamp(y * scale, -448, 448).to(e4m3)``."""
    return (y.float() * scale).clamp(-448.0, 448.0).to(E4M3)


@pytest.mark.parametrize("m", [M, 16])  # 16: swap-AB, the direct store
def test_the_next_layers_float8_quantization_fuses_and_the_kernel_stores_e4m3(
        m, fp8_on, offered):
    def block(a, w, scale_a, scale_b, scale_next):
        return quantize_next(F.silu(scaled_mm(a, w, scale_a, scale_b)), scale_next)

    shapes, dtypes = shapes_for("rowwise", m)
    with lowered(block, *shapes, (), dtype=dtypes + [F32]) as graph:
        code = graph.codegen()[0].value
    (definition,) = kernel_definitions(code)
    source = definition.value.args[1].value
    # the scale's one value, silu, the clamp; the cast is the kernel's store (C is e4m3)
    assert "cute.math.exp(" in source and "Float32(448.0)" in source
    assert ".to(cutlass.Float8E4M3FN)" not in source
    assert spec_dtypes(definition) == ["float8_e4m3fn"] * 2 + ["float32"] * 3 + [
        "float8_e4m3fn"]  # a, b, the scales, the next scale, the fused output
    assert "triton" not in code.split("async_compile.wait")[1]
    load_kernels([definition])


@pytest.mark.parametrize("kind", ["tensorwise", "rowwise"])
def test_a_dynamically_scaled_next_layer_quantizes_after_its_amax(kind, fp8_on, offered):
    """torchao's dynamic float8 recipes (training, Float8DynamicActivationFloat8Weight)
    quantize the next layer's input with a scale from the amax of all of it (tensorwise)
    or of each row (rowwise): the cast waits for that reduction, so our kernel stores the
    GEMM's bf16 output and Inductor inlines the silu into the amax and the cast (rowwise:
    one kernel for both)."""
    from torch._inductor.scheduler import Scheduler

    def block(a, w, scale_a, scale_b):
        y = F.silu(scaled_mm(a, w, scale_a, scale_b))
        amax = y.abs().amax(-1, keepdim=True) if kind == "rowwise" else y.abs().max()
        return quantize_next(y, 448.0 / amax.float().clamp(min=1e-12))

    shapes, dtypes = shapes_for(kind)
    with lowered(block, *shapes, dtype=dtypes) as graph:
        nodes = Scheduler(graph.operations).nodes  # (their code needs Triton)
    ours, *rest = nodes
    assert is_cutedsl_template(ours) and ours.node.get_dtype() == BF16
    assert any(m.is_reduction() for n in rest for m in n.get_nodes())
    assert rest[-1].get_nodes()[-1].node.get_dtype() == E4M3


def test_a_float8_value_used_again_or_a_tma_store_of_odd_rows_stays_unfused(graph):
    """The cast to float8 is the store's: a value computed from it does not translate;
    a float8 output the TMA store cannot write in whole 16-byte rows is refused, and one
    from a ping-pong warpgroup of 128 accumulator registers (which spilled)."""
    from torch._inductor import ir
    from torch._inductor.virtualized import ops

    from cutedsl_inductor.compile.records import Params
    from cutedsl_inductor.kernels.gemm.problem import fused_output_error
    from cutedsl_inductor.template.epilogue import FLOAT8_DTYPES
    from cutedsl_inductor.template.pointwise import translate_pointwise

    def body(index):
        y = ops.to_dtype(ops.load("y", index), E4M3)
        return ops.mul(y, ops.constant(2.0, F32))

    with pytest.raises(NotImplementedError, match="used again"):
        translate_pointwise(body, [sympy.Symbol("c0")], lambda name, index: "value",
                            store_only=FLOAT8_DTYPES)
    fp8_out = ir.Buffer(name="q", layout=make_layout((M, 392), E4M3))
    tma, direct = Params.of({"STORE": "tma"}), Params.of({"STORE": "direct"})
    assert "multiple of 16" in fused_output_error(tma, fp8_out)
    assert fused_output_error(direct, fp8_out) is None
    pingpong = {"STORE": "direct", "PINGPONG": True, "TILE_M": 128, "TILE_N": 128}
    assert "spills" in fused_output_error(Params.of(pingpong), fp8_out)
    assert fused_output_error(Params.of({**pingpong, "TILE_M": 64}), fp8_out) is None
    bf16_out = ir.Buffer(name="o", layout=make_layout((M, 392), BF16))
    assert fused_output_error(tma, bf16_out) is None
    int_out = ir.Buffer(name="i", layout=make_layout((M, 392), torch.int8))
    assert "fused output dtype" in fused_output_error(direct, int_out)


def test_fp8_is_off_unless_configured(monkeypatch, offered):
    shapes, dtypes = shapes_for("tensorwise")
    with virtual_sm90_max_autotune(monkeypatch, "ATEN,CUTEDSL", gemm_max_configs=1), \
            lowered(scaled_mm, *shapes, dtype=dtypes):
        pass
    (choices,) = offered
    assert choices and not ours(choices)


REFUSED = {  # why: (the call's extra inputs and arguments, the reason logged)
    "slow accumulation": ([], dict(use_fast_accum=False), "use_fast_accum=False"),
    "output scale": ([((), F32)], dict(), "output scale (scale_result)"),
    "fp8 output": ([], dict(out_dtype=E4M3), "output dtype torch.float8_e4m3fn unsupported"),
}


@pytest.mark.parametrize("why", sorted(REFUSED))
def test_refused_problems_keep_atens_choice_with_a_reason(why, fp8_on, offered, caplog):
    extra, kwargs, reason = REFUSED[why]

    def fn(a, w, scale_a, scale_b, *scale_result):
        return torch._scaled_mm(a, w.t(), scale_a, scale_b, None, *scale_result,
                                **{"out_dtype": BF16, "use_fast_accum": True, **kwargs})

    shapes, dtypes = shapes_for("tensorwise")
    with caplog.at_level(logging.DEBUG, logger="cutedsl_inductor"), \
            lowered(fn, *shapes, *(s for s, _ in extra),
                    dtype=dtypes + [d for _, d in extra]):
        pass
    (choices,) = offered
    assert choices and not ours(choices)
    assert any(reason in r.getMessage() for r in caplog.records), caplog.text


def test_a_dynamic_m_takes_rowwise_scales_and_mixed_kinds(graph):
    """Directly on the kernels' choice function: a runtime M (its rowwise scale's too) and
    a tensorwise A scale with B's rowwise one; a blockwise or misshapen scale and a
    bias that is not a vector of N are refused."""
    from cutedsl_inductor.kernels.gemm.scaled_choices import scaled_mm_choices

    m = sympy.Symbol("s0", integer=True, positive=True)
    graph.sizevars.shape_env.var_to_val[m] = sympy.Integer(1000)
    a = make_input(graph, "a", (m, K), E4M3)
    w_t = make_input(graph, "w", (K, N), E4M3, stride=(1, K))
    layout = make_layout((m, N), BF16)
    scale_a = make_input(graph, "sa", (m, 1), F32)
    scale_b = make_input(graph, "sb", (1, N), F32)
    one = make_input(graph, "one", (), F32)
    choices = []
    assert scaled_mm_choices(choices, [a, w_t, scale_a, scale_b], layout, True) is None
    assert choices and choices[0].params["SCALE_A"] == "row"
    choices = []
    assert scaled_mm_choices(choices, [a, w_t, one, scale_b], layout, True) is None
    assert (choices[0].params["SCALE_A"], choices[0].params["SCALE_B"]) == ("tensor", "col")
    blocks = make_input(graph, "blocks", (m, K // 32), F32)
    assert "scale_a" in scaled_mm_choices([], [a, w_t, blocks, scale_b], layout, True)
    e8m0 = make_input(graph, "e8m0", (1, N), torch.float8_e8m0fnu)
    assert "scale_b" in scaled_mm_choices([], [a, w_t, scale_a, e8m0], layout, True)
    bias_2d = make_input(graph, "bias", (m, N), BF16)
    assert "bias" in scaled_mm_choices([], [a, w_t, scale_a, scale_b, bias_2d], layout, True)
    w_rowmajor = make_input(graph, "w_rm", (K, N), E4M3)
    reason = scaled_mm_choices([], [a, w_rowmajor, scale_a, scale_b], layout, True)
    assert reason.startswith("FP8 WGMMA reads K-major operands only")


def test_outside_the_wrapped_lowering_no_choice_and_the_reason(graph, caplog):
    """Through Inductor's MMKernelInputs, as tuned_scaled_mm builds them, but with no
    _scaled_mm call being lowered (its v2, say): none of ours, and why."""
    from torch._inductor import config as inductor_config
    from torch._inductor.kernel_inputs import MMKernelInputs

    from cutedsl_inductor.inductor.choices import CuteDSLChoices

    nodes = [make_input(graph, "a", (M, K), E4M3),
             make_input(graph, "w", (K, N), E4M3, stride=(1, K)),
             make_input(graph, "sa", (), F32), make_input(graph, "sb", (), F32)]
    inputs = MMKernelInputs(nodes, mat1_idx=0, mat2_idx=1, out_dtype=BF16)
    with inductor_config.patch(max_autotune=True, max_autotune_gemm_backends="CUTEDSL"), \
            config.patch(fp8=True), caplog.at_level(logging.DEBUG, logger="cutedsl_inductor"):
        assert ours(CuteDSLChoices().get_template_configs(inputs, [], OP_NAME)) == []
    assert "not lowered through aten._scaled_mm" in caplog.text


def test_the_lowering_is_wrapped_once():
    from torch._inductor.lowering import lowerings

    from cutedsl_inductor.inductor.scaled_mm import install_scaled_mm

    before = lowerings[torch.ops.aten._scaled_mm.default]
    install_scaled_mm()
    assert lowerings[torch.ops.aten._scaled_mm.default] is before
    assert before._cutedsl_scaled_mm
