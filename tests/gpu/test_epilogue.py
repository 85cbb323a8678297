"""Epilogue fusion end to end on an sm_90 GPU (the blocks of the epilogue issue):
results match eager and the consumers run inside the CuteDSL GEMM kernel."""

import pytest
import torch
import torch.nn.functional as F

from cutedsl_inductor import config

pytestmark = pytest.mark.gpu


def compiled_with_fusion(fn, *args):
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    with torch._inductor.config.patch(max_autotune=True, max_autotune_gemm_backends="CUTEDSL",
                                      fx_graph_cache=False), \
            config.patch(epilogue_fusion=True, gemm_max_configs=2):
        result, codes = run_and_get_code(torch.compile(fn), *args)
    return result, "\n".join(codes)


def relative_error(out, ref):
    assert not torch.isnan(out).any()
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def randn(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


BLOCKS = {
    "gelu_bias": (lambda x, w, b: F.gelu(x @ w.t() + b), lambda: (randn(256, 512), randn(384, 512), randn(384))),
    "relu_addmm_scale_residual": (
        lambda x, w, b, r: torch.relu(torch.addmm(b, x, w.t())) * 0.5 + r,
        lambda: (randn(256, 512), randn(384, 512), randn(384), randn(256, 384))),
    "swiglu": (lambda x, w1, w3: F.silu(x @ w1.t()) * (x @ w3.t()),
               lambda: (randn(256, 512), randn(384, 512), randn(384, 512))),
    "masked_residual": (  # a bool input (a byte in memory) read in the epilogue
        lambda x, w, mask, r: torch.where(mask, x @ w.t() + r, r),
        lambda: (randn(256, 512), randn(384, 512),
                 torch.rand(256, 384, device="cuda") > 0.5, randn(256, 384))),
}


@pytest.mark.parametrize("block", sorted(BLOCKS))
def test_block_fuses_and_matches_eager(block):
    fn, make_args = BLOCKS[block]
    args = make_args()
    result, code = compiled_with_fusion(fn, *args)
    assert relative_error(result, fn(*args)) < 1e-2
    assert "_epilogue(" in code
    assert "triton_poi_fused" not in code, "a consumer stayed a separate kernel"


def test_fused_block_replays_in_cuda_graphs():
    """mode="max-autotune" captures the graph (our launches included) in CUDA graphs."""
    fn, make_args = BLOCKS["gelu_bias"]
    torch._dynamo.reset()
    with torch._inductor.config.patch(max_autotune_gemm_backends="CUTEDSL", fx_graph_cache=False), \
            config.patch(epilogue_fusion=True, gemm_max_configs=2):
        compiled = torch.compile(fn, mode="max-autotune")
        for _ in range(3):
            args = make_args()
            assert relative_error(compiled(*args).clone(), fn(*args)) < 1e-2


UNARY = {
    "exp": lambda y: torch.exp(y * 0.1), "log": lambda y: torch.log(y.abs() + 1e-3),
    "tanh": torch.tanh, "erf": torch.erf, "sigmoid": torch.sigmoid, "relu": torch.relu,
    "gelu": F.gelu, "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"), "silu": F.silu,
    "div": lambda y: y / (y.abs() + 2.0), "where_minmax": lambda y: torch.where(
        y > 0, torch.minimum(y, torch.tensor(1.0, device=y.device)), torch.maximum(y, -y * 2)),
    "to_fp32_and_back": lambda y: (y.float() * 3).to(torch.bfloat16) - 1,
}


@pytest.mark.parametrize("op", sorted(UNARY))
def test_each_translated_op_matches_eager(op):
    x, w = randn(128, 256), randn(256, 256)
    fn = lambda x, w: UNARY[op](x @ w.t())  # noqa: E731
    torch._dynamo.reset()
    with torch._inductor.config.patch(max_autotune=True, max_autotune_gemm_backends="CUTEDSL",
                                      fx_graph_cache=False), \
            config.patch(epilogue_fusion=True, gemm_max_configs=1):
        from torch._inductor.utils import run_and_get_code

        result, codes = run_and_get_code(torch.compile(fn), x, w)
    assert "_epilogue(" in "\n".join(codes)
    # float64 reference: eager's bf16 rounding of x @ w.t() would dominate the error
    assert relative_error(result, UNARY[op](x.double() @ w.double().t())) < 1e-2


def test_the_fused_kernels_of_our_fastest_choices_are_timed(caplog):
    """With a pointwise consumer our fastest choices (here both offered) are timed again
    with the epilogue fused, and the fastest fused kernel is the one kept."""
    fn, make_args = BLOCKS["gelu_bias"]
    args = make_args()
    with caplog.at_level("DEBUG", logger="cutedsl_inductor.inductor.multi_template"):
        result, code = compiled_with_fusion(fn, *args)
    assert relative_error(result, fn(*args)) < 1e-2
    (record,) = [r for r in caplog.records if "with its epilogue" in r.getMessage()]
    _, timed, kept = record.args
    assert len(timed) == 2 and timed[kept] == min(timed.values())  # ties: either is fastest


def check_row_column_and_full_inputs(m, n):
    """A fused epilogue reading a column vector (bias), a row vector and a full tensor."""
    x, w, b, r = randn(m, 512), randn(n, 512), randn(n), randn(m, n)
    rows = randn(m, 1)
    fn = lambda x, w, b, r, rows: torch.relu(x @ w.t() + b) * rows + r  # noqa: E731
    result, code = compiled_with_fusion(fn, x, w, b, r, rows)
    assert "_epilogue(" in code
    assert relative_error(result, fn(x, w, b, r, rows)) < 1e-2


@pytest.mark.parametrize("m,n", [(200, 264), (1, 4104), (130, 392)])
def test_tail_tiles_with_row_column_and_full_inputs_match_eager(m, n):
    """M and N tails: the epilogue of out-of-problem values reads its inputs at clamped
    coordinates and is dropped by the store; everything in the problem matches eager."""
    check_row_column_and_full_inputs(m, n)


@pytest.mark.parametrize("m,n", [(5, 264), (16, 4104), (32, 392)])
def test_swap_ab_epilogue_reads_inputs_at_swapped_coordinates(m, n, monkeypatch):
    """Only swap-AB choices offered (C^T = B A^T, the kernel's (m, n) torch's (n, m)): the
    fused epilogue reads row, column and full inputs at the output's coordinates."""
    from cutedsl_inductor.templates.gemm import template
    from cutedsl_inductor.templates.gemm.sm90_gemm import pick_configs

    def swap_ab_only(*args, **kwargs):
        ranked = pick_configs(*args, **dict(kwargs, max_configs=100))
        return [c for c in ranked if c.get("swap_ab")][:2]

    monkeypatch.setattr(template, "pick_configs", swap_ab_only)
    check_row_column_and_full_inputs(m, n)


@pytest.mark.parametrize("layout", ["contiguous", "odd row stride", "odd offset"])
def test_residual_views_read_in_column_pairs_match_eager(layout):
    """The epilogue and addmm's bias read two columns per load where alignment allows;
    views whose row stride or offset is odd take the two-element path."""
    m, n = 256, 384
    x, w = randn(m, 512), randn(n, 512)
    base = randn(m, n + 1)
    r = {"contiguous": randn(m, n), "odd row stride": base[:, :n],
         "odd offset": base[:, 1:]}[layout]
    for fn in (lambda x, w, r: torch.relu(x @ w.t()) + r,  # r an extra input
               lambda x, w, r: torch.addmm(r, x, w.t())):  # r the GEMM's bias
        result, code = compiled_with_fusion(fn, x, w, r)
        assert "cutedsl_sm90_gemm" in code
        assert relative_error(result, fn(x, w, r)) < 1e-2
