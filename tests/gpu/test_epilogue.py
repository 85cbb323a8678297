"""Epilogue fusion end to end on an sm_90 GPU (the blocks of the epilogue issue):
results match eager and the consumers run inside the CuteDSL GEMM kernel."""

import pytest
import torch
import torch.nn.functional as F

from cutedsl_inductor import config
from cutedsl_inductor.kernels.gemm.config import GemmConfig

pytestmark = pytest.mark.gpu


def compiled_with_fusion(fn, *args):
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    # No shape padding: Inductor's pad_mm times padded against unpadded ATen GEMMs and,
    # where padding wins (M = 5 padded to 8 on the H200), our kernel computes the padded
    # product and the epilogue, over the unpadded shape, stays a kernel of its own.
    with torch._inductor.config.patch(max_autotune=True, max_autotune_gemm_backends="CUTEDSL",
                                      fx_graph_cache=False, shape_padding=False), \
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
    # SwiGLU: both GEMMs and the product in one two-weight kernel, nothing fused after it
    assert ("'SWIGLU':" if block == "swiglu" else "_epilogue(") in code
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
    """A fused epilogue reading a column vector (bias), a row vector and a full tensor;
    returns the output code."""
    x, w, b, r = randn(m, 512), randn(n, 512), randn(n), randn(m, n)
    rows = randn(m, 1)
    fn = lambda x, w, b, r, rows: torch.relu(x @ w.t() + b) * rows + r  # noqa: E731
    result, code = compiled_with_fusion(fn, x, w, b, r, rows)
    assert "_epilogue(" in code
    assert relative_error(result, fn(x, w, b, r, rows)) < 1e-2
    return code


@pytest.mark.parametrize("m,n", [(200, 264), (1, 4104), (130, 392)])
def test_tail_tiles_with_row_column_and_full_inputs_match_eager(m, n):
    """M and N tails: the epilogue of out-of-problem values reads its inputs at clamped
    coordinates and is dropped by the store; everything in the problem matches eager."""
    check_row_column_and_full_inputs(m, n)


@pytest.mark.parametrize("m,n", [(5, 264), (16, 4104), (32, 392)])
def test_swap_ab_epilogue_reads_inputs_at_swapped_coordinates(m, n, monkeypatch):
    """Only swap-AB choices offered (C^T = B A^T, the kernel's (m, n) torch's (n, m)): the
    fused epilogue reads row, column and full inputs at the output's coordinates."""
    from cutedsl_inductor.kernels.gemm import template
    from cutedsl_inductor.kernels.gemm.heuristic import pick_configs

    def swap_ab_only(*args, **kwargs):
        ranked = pick_configs(*args, **dict(kwargs, max_configs=100))
        return [c for c in ranked if c.swap_ab][:2]

    monkeypatch.setattr(template, "pick_configs", swap_ab_only)
    check_row_column_and_full_inputs(m, n)


@pytest.mark.parametrize("m,n", [(300, 1000), (520, 392)])
def test_256x192_tiles_with_their_epilogue_spilling_match_eager(m, n, monkeypatch):
    """Only the 256x192 tile offered (192 accumulator registers per thread, so the fused
    epilogue's values spill to local memory): M and N tails, row, column and full inputs."""
    from cutedsl_inductor.kernels.gemm import template

    monkeypatch.setattr(template, "pick_configs", lambda *args, **kwargs: [GemmConfig(
        tile_m=256, tile_n=192, cluster_n=2, cooperative=True, raster="n")])
    assert "'TILE_N': 192" in check_row_column_and_full_inputs(m, n)


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


SWIGLU_SHAPES = {  # x, weight (N, K) as nn.Linear stores it; "kn": weights (K, N), x @ w
    "tails": ((200, 520), (264, 520), torch.bfloat16, "nk"),
    "3-d x, fp16": ((2, 77, 512), (392, 512), torch.float16, "nk"),
    "weights (K, N)": ((256, 512), (384, 512), torch.bfloat16, "kn"),
    "decode, swap-AB": ((1, 7, 4096), (1032, 4096), torch.bfloat16, "nk"),
    "m=20, fp16, weights (K, N)": ((20, 512), (392, 512), torch.float16, "kn"),
}


@pytest.mark.parametrize("case", sorted(SWIGLU_SHAPES))
def test_swiglu_runs_as_one_kernel_and_matches_eager(case):
    x_shape, w_shape, dtype, layout = SWIGLU_SHAPES[case]
    x = torch.randn(*x_shape, device="cuda", dtype=dtype)
    w1, w3 = (torch.randn(*w_shape, device="cuda", dtype=dtype) for _ in range(2))
    if layout == "kn":
        w1, w3 = w1.t().contiguous(), w3.t().contiguous()
        fn = lambda x, w1, w3: F.silu(x @ w1) * (x @ w3)  # noqa: E731
    else:
        fn = lambda x, w1, w3: F.silu(x @ w1.t()) * (x @ w3.t())  # noqa: E731
    result, code = compiled_with_fusion(fn, x, w1, w3)
    assert "'SWIGLU':" in code
    for other_kernel in ("extern_kernels.mm(", "triton_poi", "triton_tem"):
        assert other_kernel not in code
    assert relative_error(result, fn(x, w1, w3)) < 1e-2


def test_swiglu_the_kernel_cannot_take_runs_as_before():
    """N = 100: the output's 200-byte rows are not 16-byte units (TMA), so no two-weight
    choice; the lowering emits Inductor's own mms (ATen here) and pointwise kernel. Shape
    padding off: where pad_mm's timing pads N to 104, no SwiGLU pattern is left to refuse."""
    fn = lambda x, w1, w3: F.silu(x @ w1.t()) * (x @ w3.t())  # noqa: E731
    x, w1, w3 = randn(130, 256), randn(100, 256), randn(100, 256)
    torch._dynamo.reset()
    with torch._inductor.config.patch(max_autotune=True, fx_graph_cache=False, shape_padding=False,
                                      max_autotune_gemm_backends="ATEN,CUTEDSL"), \
            config.patch(epilogue_fusion=True):
        from torch._inductor.utils import run_and_get_code

        result, codes = run_and_get_code(torch.compile(fn), x, w1, w3)
    code = "\n".join(codes)
    assert "SWIGLU" not in code and code.count("extern_kernels.mm(") == 2
    assert relative_error(result, fn(x, w1, w3)) < 1e-2


def test_swiglu_where_the_aten_fallback_wins_runs_as_inductor_would():
    """Inductor's filter leaves the SwiGLU lowering only its ATen fallback, so that it wins,
    and each mm only its ATen choice: the pattern is lowered as Inductor would (two mms and
    one pointwise kernel), not as the fallback (two more passes over the output)."""
    fn = lambda x, w1, w3: F.silu(x @ w1.t()) * (x @ w3.t())  # noqa: E731
    x, w1, w3 = randn(256, 512), randn(384, 512), randn(384, 512)
    torch._dynamo.reset()
    with torch._inductor.config.patch({
            "max_autotune": True, "fx_graph_cache": False,
            "max_autotune_gemm_backends": "ATEN,CUTEDSL",
            "test_configs.autotune_choice_desc_regex": "^$"}), \
            config.patch(epilogue_fusion=True):
        from torch._inductor.utils import run_and_get_code

        result, codes = run_and_get_code(torch.compile(fn), x, w1, w3)
    code = "\n".join(codes)
    assert "SWIGLU" not in code and "cutedsl_swiglu_mm_aten" not in code
    assert code.count("extern_kernels.mm(") == 2 and code.count("@triton.jit") == 1
    assert relative_error(result, fn(x, w1, w3)) < 1e-2


SWIGLU_CONFIGS = [
    GemmConfig(tile_m=128, tile_n=128, cluster_m=2, cooperative=True, raster="m", swiglu="b"),
    GemmConfig(tile_m=256, tile_n=64, cluster_n=2, cooperative=True, raster="n", swiglu="b"),
    GemmConfig(tile_m=256, tile_n=96, cluster_n=2, cooperative=True, raster="n", swiglu="b"),
    GemmConfig(tile_m=128, tile_n=64, cluster_m=2, cooperative=False, pingpong=True, raster="m",
         swiglu="b"),
    GemmConfig(tile_m=64, tile_n=128, cluster_n=2, cooperative=False, raster="n", swiglu="b"),
    GemmConfig(tile_m=64, tile_n=32, cooperative=False, raster="n", store="direct", swiglu="b"),
    # swap-AB (C^T = W X^T, the weights the kernel's A): tile_n runs over torch's M
    GemmConfig(tile_m=64, tile_n=16, cluster_m=2, cooperative=False, raster="m", store="direct",
         swap_ab=True, swiglu="a"),
    GemmConfig(tile_m=128, tile_n=32, cluster_m=2, cooperative=True, raster="m", store="direct",
         swap_ab=True, swiglu="a"),
]


@pytest.mark.parametrize("weights", ["nk", "kn"])
@pytest.mark.parametrize("cfg", SWIGLU_CONFIGS, ids=lambda c: f"{c.tile_m}x{c.tile_n}"
                         + ("_pp" if c.pingpong else "_coop" if c.cooperative
                            else "_1wg") + ("_swap" if c.swap_ab else ""))
def test_each_kind_of_swiglu_kernel_matches_eager(cfg, weights, monkeypatch):
    """One config at a time, the only choice (the ATen fallback filtered out): M, N and K
    tails, several tiles per CTA (ping-pong's turns), both weights' tails zero-filled;
    weights (N, K) as nn.Linear stores them, or (K, N) (``x @ w``): the two layouts in
    which a stage's two weight tiles form one tile twice as wide (one WGMMA)."""
    from cutedsl_inductor.kernels.gemm import template

    monkeypatch.setattr(template, "swiglu_configs", lambda *args, **kwargs: [cfg])
    x, w1, w3 = randn(1000, 712), randn(1048, 712), randn(1048, 712)
    fn = lambda x, w1, w3: F.silu(x @ w1.t()) * (x @ w3.t())  # noqa: E731
    if weights == "kn":
        w1, w3 = w1.t().contiguous(), w3.t().contiguous()
        fn = lambda x, w1, w3: F.silu(x @ w1) * (x @ w3)  # noqa: E731
    with torch._inductor.config.patch({"test_configs.autotune_choice_desc_regex": "SWIGLU"}):
        result, code = compiled_with_fusion(fn, x, w1, w3)
    assert "'SWIGLU':" in code
    assert relative_error(result, fn(x, w1, w3)) < 1e-2


def test_swiglu_with_a_dynamic_batch_serves_every_m():
    """x's sequence length marked dynamic: the rewrite keeps the symbolic sizes (the
    reshapes of a 3-D x) and the kernel serves the traced size."""
    fn = lambda x, w1, w3: F.silu(x @ w1.t()) * (x @ w3.t())  # noqa: E731
    w1, w3 = randn(264, 512), randn(264, 512)
    x = randn(3, 100, 512)
    torch._dynamo.mark_dynamic(x, 1)
    result, code = compiled_with_fusion(fn, x, w1, w3)
    assert "'SWIGLU':" in code
    assert relative_error(result, fn(x, w1, w3)) < 1e-2


def test_swiglu_retimes_our_fastest_choices_in_rounds(caplog):
    """Where our kernel wins the op's autotuning, our fastest choices (here both offered)
    are timed again in interleaved rounds and the fastest median is kept."""
    fn = lambda x, w1, w3: F.silu(x @ w1.t()) * (x @ w3.t())  # noqa: E731
    x, w1, w3 = randn(1024, 1024), randn(2048, 1024), randn(2048, 1024)
    with caplog.at_level("DEBUG", logger="cutedsl_inductor.inductor.swiglu"):
        result, code = compiled_with_fusion(fn, x, w1, w3)
    assert code.count("'SWIGLU':") == 1
    assert relative_error(result, fn(x, w1, w3)) < 1e-2
    (record,) = [r for r in caplog.records if "retimed in rounds" in r.getMessage()]
    timed, kept = record.args
    assert len(timed) == 2 and timed[kept] == min(timed.values())


def test_swiglu_takes_the_retimed_winner_over_a_mistimed_one(monkeypatch, caplog):
    """The op's autotuning misranks (the 64x32 tile's timing read as 100x faster than it
    ran): the retiming keeps the 128x128 kernel, the only SwiGLU kernel in the output code,
    the misranked one's node left unused and dropped."""
    from cutedsl_inductor.kernels.gemm import template
    from cutedsl_inductor.template.caller import CuteDSLTemplateCaller

    slow = GemmConfig(tile_m=64, tile_n=32, cooperative=False, raster="n", store="direct",
                      swiglu="b")
    fast = GemmConfig(tile_m=128, tile_n=128, cluster_m=2, cooperative=True, raster="m",
                      swiglu="b")
    monkeypatch.setattr(template, "swiglu_configs", lambda *args, **kwargs: [slow, fast])
    measured = CuteDSLTemplateCaller.benchmark

    def misranked(self, *args, out):
        ms = measured(self, *args, out=out)
        return ms / 100 if self.params["TILE_N"] == 32 else ms

    monkeypatch.setattr(CuteDSLTemplateCaller, "benchmark", misranked)
    fn = lambda x, w1, w3: F.silu(x @ w1.t()) * (x @ w3.t())  # noqa: E731
    x, w1, w3 = randn(2048, 1024), randn(2048, 1024), randn(2048, 1024)
    with caplog.at_level("DEBUG", logger="cutedsl_inductor.inductor.swiglu"):
        result, code = compiled_with_fusion(fn, x, w1, w3)
    (record,) = [r for r in caplog.records if "retimed in rounds" in r.getMessage()]
    timed, kept = record.args
    assert len(timed) == 2 and "TILE_N=128" in kept
    assert code.count("'SWIGLU':") == 1 and "'TILE_N': 128" in code
    assert "'TILE_N': 32" not in code
    assert relative_error(result, fn(x, w1, w3)) < 1e-2


def test_a_repeated_layer_takes_the_first_layers_retimed_winner(caplog):
    """Two layers of one shape (their own weights): the first layer's fused candidates
    and SwiGLU configs are timed in rounds, the second's take those winners untimed."""
    def fn(x, w1, b1, w2, b2, g1, u1, g2, u2):
        return (F.gelu(x @ w1.t() + b1), F.gelu(x @ w2.t() + b2),
                F.silu(x @ g1.t()) * (x @ u1.t()), F.silu(x @ g2.t()) * (x @ u2.t()))

    x = randn(1024, 1024)
    args = (x, randn(2048, 1024), randn(2048), randn(2048, 1024), randn(2048),
            *(randn(2048, 1024) for _ in range(4)))
    with caplog.at_level("DEBUG", logger="cutedsl_inductor.inductor"):
        results, code = compiled_with_fusion(fn, *args)
    for result, ref in zip(results, fn(*args)):
        assert relative_error(result, ref) < 1e-2
    for marker in ("with its epilogue", "SwiGLU retimed in rounds"):
        timings = [r.args[-2] for r in caplog.records if marker in r.getMessage()]
        assert len(timings) == 2, marker
        assert isinstance(timings[0], dict) and len(timings[0]) == 2
        assert timings[1] == "as the earlier retiming of these " + (
            "kernels" if marker == "with its epilogue" else "configs")
