"""The FP8 GEMM (``torch._scaled_mm``'s choices, ``config.fp8``) on an sm_90 GPU: every
choice of the heuristic's first ones against the float64 product of the dequantized
operands (tensorwise and rowwise scales, bias, bf16 and fp32 output, e4m3/e5m2 mixes,
odd multiples of 16, swap-AB and split-K at small M), each into a NaN-poisoned output;
torch.compile end to end (dynamic M too); a torchao float8 Linear stack whose output
code calls our kernel."""

import pytest
import torch

from cutedsl_inductor import config
from cutedsl_inductor.bench.gemm_fp8 import quantize, reference

pytestmark = pytest.mark.gpu

# relative Frobenius error against float64: the output's rounding (bf16: 2^-9 per value)
# and the WGMMA's FP8 accumulation (fast accumulation, as cuBLAS's use_fast_accum=True)
TOLERANCE = {torch.bfloat16: 1e-2, torch.float32: 5e-3}
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def relative_error(out, ref):
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


def compiled_code(backends, fn, *args, dynamic_dim=None):
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    if dynamic_dim is not None:
        torch._dynamo.maybe_mark_dynamic(args[0], dynamic_dim)
    with torch._inductor.config.patch(max_autotune=True, max_autotune_gemm_backends=backends,
                                      fx_graph_cache=False), \
            config.patch(fp8=True, gemm_max_configs=3):
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
def test_a_torchao_float8_linear_stack_calls_our_kernel(recipe):
    """torchao's float8 training recipe on a two-layer MLP: the compiled forward (its
    _scaled_mm with fast accumulation) calls our kernel and matches eager float8 within
    bf16's error; a training step through it (the backward's _scaled_mm, without fast
    accumulation, stays ATen's) gives eager's gradients."""
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
    assert relative_error(result, expected.double()) < 2e-2

    eager(x).float().square().mean().backward()
    trained = model()
    _, code = compiled_code("ATEN,CUTEDSL",
                            lambda t: trained(t).float().square().mean().backward(), x)
    for ours, ref in zip(trained.parameters(), eager.parameters()):
        assert relative_error(ours.grad, ref.grad.double()) < 5e-2
