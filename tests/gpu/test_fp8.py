"""The FP8 GEMM (``torch._scaled_mm``'s choices, ``config.fp8``) on an sm_90 GPU: every
choice of the heuristic's first ones against the float64 product of the dequantized
operands (tensorwise and rowwise scales, bias, bf16 and fp32 output, e4m3/e5m2 mixes,
odd multiples of 16, swap-AB and split-K at small M), each into a NaN-poisoned output;
torch.compile end to end (dynamic M too); fused epilogues (relu, a residual, the cast to
bf16; the next layer's static float8 quantization, an e4m3 output); a torchao float8
Linear stack whose output code calls our kernel; the FP8 SwiGLU (``config.fp8_swiglu``):
its choices against the fp32 SwiGLU of the dequantized operands, and torchao float8
SwiGLU MLPs whose output code calls it."""

import pytest
import torch

from cutedsl_inductor import config
from cutedsl_inductor.bench.gemm_fp8 import quantize, reference
from tests.gpu.test_gemm import assert_no_element_off

pytestmark = pytest.mark.gpu

# relative Frobenius error against float64: the output's rounding (bf16: 2^-9 per value)
# and the WGMMA's FP8 accumulation (fast accumulation, as cuBLAS's use_fast_accum=True)
TOLERANCE = {torch.bfloat16: 1e-2, torch.float32: 5e-3}
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def relative_error(out, ref):
    """The relative Frobenius error, once no value is NaN and none is far off: a few
    wrong elements (a lost split-K partial, a race) hide in a norm over thousands."""
    assert not torch.isnan(out).any(), "NaN in the output"
    assert_no_element_off(out, ref)
    return norm_error(out, ref)


def norm_error(out, ref):
    """The relative Frobenius error alone (NaN-free), where single values may differ by a
    step of an FP8 cast the two sides round apart."""
    assert not torch.isnan(out).any(), "NaN in the output"
    return ((out.double() - ref).norm() / ref.norm()).item()


def fp8_inputs(m, n, k, recipe, a_dtype=E4M3, b_dtype=E4M3, bias_dtype=None):
    """(a, b, scale_a, scale_b[, bias]) as ``_scaled_mm`` takes them: b the (K, N)
    column-major view of an (N, K) weight."""
    a, scale_a = quantize(torch.randn(m, k, device="cuda"), recipe)
    w, scale_w = quantize(torch.randn(n, k, device="cuda"), recipe)
    inputs = [a.to(a_dtype), w.to(b_dtype).t(), scale_a, scale_w.t()]
    if bias_dtype is not None:
        inputs.append(torch.randn(n, device="cuda", dtype=bias_dtype))
    return inputs


def choice_outputs(inputs, out_dtype, configs):
    """The first ``configs`` FP8 choices run directly, each into a NaN-poisoned output."""
    from torch._inductor import ir

    from cutedsl_inductor.autotune.scratch import scratch_graph
    from cutedsl_inductor.kernels.gemm.scaled_choices import scaled_mm_choices

    m, n = inputs[0].shape[0], inputs[1].shape[1]
    with scratch_graph() as scratch:
        nodes = [scratch.input(t.shape, t.dtype, t.stride()) for t in inputs]
        layout = ir.FixedLayout(torch.device("cuda", 0), out_dtype, [m, n])
        choices = []
        reason = scaled_mm_choices(choices, nodes, layout, use_fast_accum=True)
    assert reason is None and choices, reason
    for choice in choices[:configs]:
        out = torch.full((m, n), float("nan"), device="cuda", dtype=out_dtype)
        choice.load().run(*inputs, out)
        torch.cuda.synchronize()
        yield choice.description, out


CASES = [  # (M, N, K): multiples of 16 (as _scaled_mm requires of N and K), odd ones
    (1, 4096, 4096), (16, 1040, 2064), (128, 4096, 4096), (1008, 1040, 208),
    (2000, 3056, 4096), (4096, 4096, 4096),
]


@pytest.mark.parametrize("m,n,k", CASES)
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
@pytest.mark.parametrize("out_dtype,bias_dtype", [(torch.bfloat16, None),
                                                  (torch.bfloat16, torch.bfloat16),
                                                  (torch.float32, torch.float32)])
def test_choices_match_the_dequantized_float64_product(m, n, k, recipe, out_dtype,
                                                       bias_dtype):
    inputs = fp8_inputs(m, n, k, recipe, bias_dtype=bias_dtype)
    ref = reference(*inputs)
    for description, out in choice_outputs(inputs, out_dtype, configs=3):
        assert relative_error(out, ref) < TOLERANCE[out_dtype], description


@pytest.mark.parametrize("a_dtype,b_dtype", [(E4M3, E5M2), (E5M2, E4M3), (E5M2, E5M2)])
def test_e5m2_operands_match(a_dtype, b_dtype):
    inputs = fp8_inputs(1000, 1024, 512, "rowwise", a_dtype, b_dtype)
    ref = reference(*inputs)
    for description, out in choice_outputs(inputs, torch.bfloat16, configs=2):
        assert relative_error(out, ref) < 3e-2, description  # e5m2: 2 mantissa bits


def test_every_offered_config_matches_at_a_few_shapes():
    with config.patch(gemm_exhaustive=True):
        for m, n, k in [(16, 2048, 1024), (256, 2048, 1024)]:
            inputs = fp8_inputs(m, n, k, "rowwise", bias_dtype=torch.bfloat16)
            ref = reference(*inputs)
            for description, out in choice_outputs(inputs, torch.bfloat16, configs=10**6):
                assert relative_error(out, ref) < TOLERANCE[torch.bfloat16], description


def compiled_code(backends, fn, *args, dynamic_dim=None, max_configs=3, **knobs):
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    if dynamic_dim is not None:
        torch._dynamo.maybe_mark_dynamic(args[0], dynamic_dim)
    with torch._inductor.config.patch(max_autotune=True, max_autotune_gemm_backends=backends,
                                      fx_graph_cache=False), \
            config.patch(fp8=True, gemm_max_configs=max_configs, **knobs):
        result, codes = run_and_get_code(torch.compile(fn), *args)
    return result, "\n".join(codes)


def scaled_mm(a, b, scale_a, scale_b, *bias):
    return torch._scaled_mm(a, b, scale_a, scale_b, *bias, out_dtype=torch.bfloat16,
                            use_fast_accum=True)


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_compile_runs_our_kernel_and_matches_aten(recipe):
    inputs = fp8_inputs(1000, 2048, 1024, recipe, bias_dtype=torch.bfloat16)
    result, code = compiled_code("CUTEDSL", scaled_mm, *inputs)
    assert "cutedsl_sm90_gemm" in code
    assert relative_error(result, reference(*inputs)) < TOLERANCE[torch.bfloat16]
    assert relative_error(result, scaled_mm(*inputs).double()) < TOLERANCE[torch.bfloat16]


def test_a_dynamic_m_runs_one_symbolic_kernel():
    """A dynamic M (mark_dynamic on A and its rowwise scale): one graph, our kernel."""
    from unittest import mock

    from torch._inductor.graph import GraphLowering

    w, scale_w = quantize(torch.randn(1024, 512, device="cuda"), "rowwise")
    torch._dynamo.reset()
    compiled = torch.compile(scaled_mm)
    codes = []
    with torch._inductor.config.patch(max_autotune=True, max_autotune_gemm_backends="CUTEDSL",
                                      fx_graph_cache=False), \
            config.patch(fp8=True, gemm_max_configs=2), \
            mock.patch.object(GraphLowering, "save_output_code", codes.append):
        for m in (300, 17, 1000):
            a, scale_a = quantize(torch.randn(m, 512, device="cuda"), "rowwise")
            for t in (a, scale_a):
                torch._dynamo.maybe_mark_dynamic(t, 0)
            args = (a, w.t(), scale_a, scale_w.t())
            assert relative_error(compiled(*args), reference(*args)) < 1e-2, m
    assert len(codes) == 1 and "cutedsl_sm90_gemm" in codes[0]


def test_use_fast_accum_false_stays_with_aten():
    inputs = fp8_inputs(512, 1024, 1024, "tensorwise")

    def slow(a, b, scale_a, scale_b):
        return torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.bfloat16)

    result, code = compiled_code("ATEN,CUTEDSL", slow, *inputs)
    assert "cutedsl_sm90_gemm" not in code
    assert relative_error(result, reference(*inputs)) < TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_relu_a_residual_and_the_cast_to_bf16_fuse_into_our_kernel(recipe):
    """An fp32 _scaled_mm, relu, a bf16 residual, the cast to bf16: one kernel of ours (no
    Triton kernel), against the float64 product of the dequantized operands."""
    a, b, scale_a, scale_b = fp8_inputs(1000, 2048, 1024, recipe)
    residual = torch.randn(1000, 2048, device="cuda", dtype=torch.bfloat16)

    def block(a, b, scale_a, scale_b, residual):
        out = torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.float32,
                               use_fast_accum=True)
        return (torch.relu(out) + residual).to(torch.bfloat16)

    result, code = compiled_code("CUTEDSL", block, a, b, scale_a, scale_b, residual)
    assert "cutedsl_sm90_gemm" in code and "@triton.jit" not in code
    assert result.dtype == torch.bfloat16
    ref = reference(a, b, scale_a, scale_b).relu() + residual.double()
    assert relative_error(result, ref) < TOLERANCE[torch.bfloat16]


def quantize_static(y, act_scale):
    """The next layer's input as torchao's static float8 recipe casts it, with a
    calibrated scale (``Float8StaticActivationFloat8WeightConfig``'s ``act_quant_scale``)."""
    return (y.float() / act_scale).clamp(-448.0, 448.0).to(E4M3)


def within_e4m3_and_accumulation_error(ours, eager, exact):
    """Every value of ``ours`` is within one e4m3 step of the float64 value ``exact`` plus
    the FP8 fast accumulation's error, which is absolute: a value near zero moves by what
    the sum's rounding loses, and ours (split over K) and ATen's kernel sum in different
    orders, so near zero the two may be several steps apart. 2^-8 of the values' root
    mean square bounds it and still catches a lost partial or K tile (an error of a third
    of that mean or more). Most values are eager's."""
    ours, eager = ours.float().double(), eager.float().double()
    assert not torch.isnan(ours).any()
    step = exact.abs() * 2.0**-3 + 2.0**-9  # e4m3: 3 mantissa bits, subnormals 2^-9
    bound = step + 2.0**-8 * exact.square().mean().sqrt()
    off = ((ours - exact).abs() > bound).nonzero().tolist()
    assert not off, f"{len(off)} values off, (row, col, ours, eager, float64): " + ", ".join(
        f"({i}, {j}, {ours[i, j].item():g}, {eager[i, j].item():g}, {exact[i, j].item():.4g})"
        for i, j in off[:8])
    assert (ours == eager).float().mean() > 0.9


@pytest.mark.parametrize("m", [16, 1000])  # 16: swap-AB, the direct store
def test_a_float8_linear_stack_quantizes_the_next_input_in_our_epilogue(m):
    """Two float8 Linears with a static activation scale: the first GEMM's epilogue
    applies silu and quantizes the second's input (an e4m3 output, no Triton kernel
    between them); the stack matches eager within the second GEMM's bf16 rounding."""
    a, w1, scale_a, scale_w1 = fp8_inputs(m, 2048, 1024, "rowwise")
    # the second layer tensorwise, as the static recipe's (ATen takes no scale mix)
    w2, scale_w2 = quantize(torch.randn(1024, 2048, device="cuda"), "tensorwise")
    hidden = torch.nn.functional.silu(scaled_mm(a, w1, scale_a, scale_w1))
    act_scale = hidden.abs().amax().float() / 448.0  # calibrated once, then static

    def first(a, w1, scale_a, scale_w1, act_scale):
        return quantize_static(torch.nn.functional.silu(scaled_mm(a, w1, scale_a, scale_w1)),
                               act_scale)

    def stack(a, w1, scale_a, scale_w1, act_scale, w2, scale_w2):
        q = first(a, w1, scale_a, scale_w1, act_scale)
        return scaled_mm(q, w2.t(), act_scale, scale_w2)

    # two configs: the third at this shape is a ping-pong 128x128 tile, which stores bf16
    # (problem.fused_output_error)
    q, code = compiled_code("CUTEDSL", first, a, w1, scale_a, scale_w1, act_scale,
                            max_configs=2)
    assert "cutedsl_sm90_gemm" in code and "@triton.jit" not in code
    assert q.dtype == E4M3
    exact = torch.nn.functional.silu(reference(a, w1, scale_a, scale_w1)) / act_scale.double()
    within_e4m3_and_accumulation_error(q, first(a, w1, scale_a, scale_w1, act_scale), exact)

    args = (a, w1, scale_a, scale_w1, act_scale, w2, scale_w2)
    result, code = compiled_code("CUTEDSL", stack, *args, max_configs=2)
    assert code.count(".run(") == 2 and "@triton.jit" not in code
    expected = stack(*args).double()
    # the hidden values' one-step flips move single outputs by a few percent: the norm alone
    assert norm_error(result, expected) < 5e-2


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_a_torchao_float8_linear_stack_calls_our_kernel(recipe):
    """torchao's float8 training recipe on a two-layer MLP: the compiled forward (its
    _scaled_mm with fast accumulation) calls our kernel and matches eager float8 within
    bf16's error; a training step through it (the backward's _scaled_mm, without fast
    accumulation, stays ATen's) gives the gradients of the same step compiled without
    ours."""
    float8 = pytest.importorskip("torchao.float8")

    def model():
        torch.manual_seed(0)
        mlp = torch.nn.Sequential(torch.nn.Linear(1024, 2048, bias=False), torch.nn.SiLU(),
                                  torch.nn.Linear(2048, 1024, bias=False))
        mlp = mlp.to(device="cuda", dtype=torch.bfloat16)
        return float8.convert_to_float8_training(
            mlp, config=float8.Float8LinearConfig.from_recipe_name(recipe))

    x = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)
    eager = model()
    with torch.no_grad():
        expected = eager(x)
        result, code = compiled_code("CUTEDSL", model(), x)
    assert "cutedsl_sm90_gemm" in code
    # the norm alone: eager and Inductor quantize the hidden values with their own roundings
    assert norm_error(result, expected.double()) < 2e-2

    # the gradients against the same step compiled with ATen's GEMMs alone: against eager,
    # Inductor's fusions round the activations that later scales and e5m2 casts read
    # differently (tensorwise weight gradients differed by 5.2% on an H100)
    trained = {}
    for backends in ("ATEN", "ATEN,CUTEDSL"):
        trained[backends] = model()
        compiled_code(backends, lambda t: trained[backends](t).float().square().mean()
                      .backward(), x)
    for ours, ref in zip(trained["ATEN,CUTEDSL"].parameters(), trained["ATEN"].parameters()):
        assert norm_error(ours.grad, ref.grad.double()) < 5e-2


def swiglu_inputs(m, n, k, recipe):
    """(x, w_gate, w_up, scale_x, scale_gate, scale_up) as ``cutedsl::scaled_swiglu_mm``
    takes them: the weights (K, N) column-major views of (N, K) ones."""
    x, scale_x = quantize(torch.randn(m, k, device="cuda"), recipe)
    weights = [quantize(torch.randn(n, k, device="cuda"), recipe) for _ in range(2)]
    return [x, *(w.t() for w, _ in weights), scale_x, *(s.t() for _, s in weights)]


def swiglu_reference(x, w_gate, w_up, scale_x, scale_gate, scale_up):
    """The fp32 SwiGLU of the dequantized operands."""
    xd = x.float() * scale_x
    gate, up = (xd @ (w.float() * s) for w, s in ((w_gate, scale_gate), (w_up, scale_up)))
    return torch.nn.functional.silu(gate) * up


def swiglu_choice_outputs(inputs, configs):
    """The first ``configs`` FP8 SwiGLU choices run directly, each into a NaN-poisoned
    bf16 output."""
    from torch._inductor import ir

    from cutedsl_inductor.autotune.scratch import scratch_graph
    from cutedsl_inductor.kernels.gemm.scaled_choices import scaled_swiglu_choices

    m, n = inputs[0].shape[0], inputs[1].shape[1]
    with scratch_graph() as scratch:
        nodes = [scratch.input(t.shape, t.dtype, t.stride()) for t in inputs]
        layout = ir.FixedLayout(torch.device("cuda", 0), torch.bfloat16, [m, n])
        choices = []
        reason = scaled_swiglu_choices(choices, nodes, layout)
    assert reason is None and choices, reason
    for choice in choices[:configs]:
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        choice.load().run(*inputs, out)
        torch.cuda.synchronize()
        yield choice.description, out


@pytest.mark.parametrize("m,n,k", [(1, 4096, 4096), (16, 1040, 2064), (1008, 1040, 208),
                                   (2000, 3056, 4096), (4096, 14336, 4096)])
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_fp8_swiglu_choices_match_the_dequantized_fp32_swiglu(m, n, k, recipe):
    inputs = swiglu_inputs(m, n, k, recipe)
    ref = swiglu_reference(*inputs).double()
    for description, out in swiglu_choice_outputs(inputs, configs=4):
        assert relative_error(out, ref) < TOLERANCE[torch.bfloat16], description


def test_the_fp8_swiglu_ops_aten_form_matches_too():
    from cutedsl_inductor.inductor.scaled_swiglu import scaled_swiglu_mm

    inputs = swiglu_inputs(1000, 2048, 1024, "rowwise")
    out = scaled_swiglu_mm(*inputs, torch.bfloat16)
    assert relative_error(out, swiglu_reference(*inputs).double()) < 2e-2


@pytest.mark.parametrize("recipe", ["inference-rowwise", "inference-tensorwise",
                                    "training-rowwise", "training-tensorwise"])
def test_a_torchao_float8_swiglu_mlp_calls_our_fp8_swiglu_kernel(recipe):
    """A float8 SwiGLU MLP (torchao's inference config, or a training recipe's no-grad
    forward) compiled with ``config.fp8_swiglu``: x's two quantizations are one, the
    SwiGLU one kernel of ours (only ours autotuned), matching eager float8."""
    from tests.inductor.test_scaled_swiglu import SwigluMLP, to_float8

    torch.manual_seed(0)
    mlp = SwigluMLP().to(device="cuda")
    to_float8(mlp, recipe)
    x = torch.randn(4, 128, mlp.w1.in_features, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        expected = mlp(x)
        with torch._inductor.config.patch(
                {"test_configs.autotune_choice_desc_regex": "sm90_gemm"}):
            result, code = compiled_code("ATEN,CUTEDSL", mlp, x, fp8_swiglu=True)
    assert code.count("'SCALE_UP':") == 1 and "'SWIGLU': 'b'" in code
    # ours rounds silu(gate) * up once, eager each factor to bf16 first: w2's e4m3 input
    # may differ by one step in a few values: the norm alone
    assert norm_error(result, expected.double()) < 5e-2
