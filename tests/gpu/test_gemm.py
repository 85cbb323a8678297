"""The Hopper GEMM on an sm_90 GPU: correctness against float64 on fresh random inputs
(tails, transposes, batches, bias/alpha/beta), the ping-pong configs called directly,
and torch.compile end to end."""

import functools
import random

import pytest
import torch

from cutedsl_inductor import config
from cutedsl_inductor.kernels.gemm.heuristic import DEFAULT_CONFIGS, EXTRA_CONFIGS

pytestmark = pytest.mark.gpu

TOLERANCE = 1e-2  # relative Frobenius error for 16-bit operands and outputs


def relative_error(out, ref):
    """The relative Frobenius error, once no value is NaN and none is far off: a few
    wrong elements (a lost split-K partial, a race) hide in a norm over thousands."""
    assert not torch.isnan(out).any(), "NaN in the output"
    assert_no_element_off(out, ref)
    return ((out.double() - ref).norm() / ref.norm()).item()


def assert_no_element_off(out, ref):
    """Each value within 2^-6 of its own magnitude plus 2^-8 of the largest (rounding
    and accumulation order stay far inside; a lost partial sum does not)."""
    error = (out.double() - ref).abs()
    off = (error > 2.0**-6 * ref.abs() + 2.0**-8 * ref.abs().max()).nonzero()
    assert len(off) == 0, f"{len(off)} of {out.numel()} values off, the first at " + ", ".join(
        f"{tuple(i)}: {out[tuple(i)].item():g} for {ref[tuple(i)].item():g}"
        for i in off[:4].tolist())


def template_outputs(op, inputs, out_shape, alpha=1.0, beta=0.0, configs=1, config_list=None):
    """Run the first ``configs`` GEMM choices (the heuristic's, or of ``config_list``)
    directly, each into a NaN-poisoned output."""
    from torch._inductor import ir

    from cutedsl_inductor.autotune.scratch import scratch_graph
    from cutedsl_inductor.kernels.gemm.template import gemm_choices

    dtype = inputs[-1].dtype
    with scratch_graph() as scratch:
        nodes = [scratch.input(t.shape, t.dtype, t.stride()) for t in inputs]
        layout = ir.FixedLayout(torch.device("cuda", 0), dtype, list(out_shape))
        choices = []
        gemm_choices(choices, op, nodes, layout, alpha=alpha, beta=beta, configs=config_list)
    assert choices, "no CuteDSL GEMM choice"
    for choice in choices[:configs]:
        out = torch.full(out_shape, float("nan"), device="cuda", dtype=dtype)
        choice.load().run(*inputs, out)
        torch.cuda.synchronize()
        yield choice.description, out


def operand_a(m, k, dtype, transposed):
    return (torch.randn(k, m, device="cuda", dtype=dtype).t() if transposed
            else torch.randn(m, k, device="cuda", dtype=dtype))


def operand_b(k, n, dtype, transposed):
    return (torch.randn(n, k, device="cuda", dtype=dtype).t() if transposed
            else torch.randn(k, n, device="cuda", dtype=dtype))


CASES = [  # (M, N, K, dtype, A transposed, B transposed)
    (1000, 1000, 1000, torch.bfloat16, False, False),
    (129, 264, 72, torch.bfloat16, False, True),
    (304, 256, 136, torch.float16, True, False),  # A^T needs M % 8 == 0 (TMA)
    (64, 128, 8, torch.bfloat16, True, True),
    (1, 4104, 512, torch.bfloat16, False, True),  # decode: M = 1 runs the symbolic-M binary
]


@pytest.mark.parametrize("m,n,k,dtype,a_t,b_t", CASES)
def test_mm_matches_float64(m, n, k, dtype, a_t, b_t):
    a, b = operand_a(m, k, dtype, a_t), operand_b(k, n, dtype, b_t)
    ref = a.double() @ b.double()
    for description, out in template_outputs("mm", [a, b], (m, n), configs=2):
        assert relative_error(out, ref) < TOLERANCE, description


def test_random_shapes_match_float64():
    rng = random.Random()
    for _ in range(3):
        m, n, k = rng.randint(1, 2048), 8 * rng.randint(1, 256), 8 * rng.randint(1, 256)
        dtype = rng.choice([torch.bfloat16, torch.float16])
        a, b = torch.randn(m, k, device="cuda", dtype=dtype), operand_b(k, n, dtype, rng.random() < 0.5)
        ref = a.double() @ b.double()
        for description, out in template_outputs("mm", [a, b], (m, n)):
            assert relative_error(out, ref) < TOLERANCE, f"{m}x{n}x{k} {description}"


@pytest.mark.parametrize("cfg", EXTRA_CONFIGS, ids=lambda c: c.name)
def test_small_tile_configs_match_float64(cfg):
    """The small-M candidates outside DEFAULT_CONFIGS, over M, N and K tails."""
    a = torch.randn(129, 1000, device="cuda", dtype=torch.bfloat16)
    b = operand_b(1000, 264, torch.bfloat16, True)
    ((description, out),) = template_outputs("mm", [a, b], (129, 264), config_list=[cfg])
    assert relative_error(out, a.double() @ b.double()) < TOLERANCE, description


def loaded_gemm(cfg, a, b, out_shape):
    """The GEMM choice of ``cfg`` for ``a @ b``, loaded (``run(a, b, out)``)."""
    from torch._inductor import ir

    from cutedsl_inductor.autotune.scratch import scratch_graph
    from cutedsl_inductor.kernels.gemm.template import gemm_choices

    with scratch_graph() as scratch:
        nodes = [scratch.input(t.shape, t.dtype, t.stride()) for t in (a, b)]
        layout = ir.FixedLayout(torch.device("cuda", 0), a.dtype, list(out_shape))
        choices = []
        gemm_choices(choices, "mm", nodes, layout, configs=[cfg])
    assert len(choices) == 1 and "PDL=True" in choices[0].description
    return choices[0].load()


@pytest.mark.parametrize("cfg", [DEFAULT_CONFIGS[0], EXTRA_CONFIGS[0]], ids=lambda c: c.name)
def test_pdl_gemms_wait_for_the_kernel_before_them(cfg):
    """A chain of a torch kernel writing A, a PDL GEMM, a second PDL GEMM reading the first's
    output and a torch kernel reading the second's, with the outputs poisoned with NaN by the
    kernels just before: a GEMM that touched memory before the previous kernel ended would
    read stale or NaN data. Run eagerly on fresh inputs, then captured in a CUDA graph and
    replayed on fresh inputs."""
    cfg = cfg.replace(pdl=True)
    m, n, k = 256, 1024, 2048
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    x, a = torch.empty(m, k, **bf16), torch.empty(m, k, **bf16)
    w1, w2 = operand_b(k, n, torch.bfloat16, True), operand_b(n, n, torch.bfloat16, True)
    c1, c2, d = (torch.empty(m, n, **bf16) for _ in range(3))
    first, second = loaded_gemm(cfg, a, w1, (m, n)), loaded_gemm(cfg, c1, w2, (m, n))

    def chain():
        c1.fill_(float("nan"))
        c2.fill_(float("nan"))
        torch.mul(x, 0.5, out=a)
        first.run(a, w1, c1)
        second.run(c1, w2, c2)
        torch.neg(c2, out=d)

    def check():
        ref = -((0.5 * x.double()) @ w1.double()).to(torch.bfloat16).double() @ w2.double()
        assert relative_error(d, ref) < TOLERANCE, cfg.name

    for _ in range(3):
        x.normal_()
        chain()
        torch.cuda.synchronize()
        check()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chain()
    for _ in range(3):
        x.normal_()
        graph.replay()
        torch.cuda.synchronize()
        check()


@pytest.mark.parametrize("cfg", [c for c in DEFAULT_CONFIGS + EXTRA_CONFIGS
                                 if c.tile_n in (192, 224)], ids=lambda c: c.name)
@pytest.mark.parametrize("b_t", [False, True])
def test_tiles_of_192_and_224_match_float64(cfg, b_t):
    """N tiles that are not a power of two (224: B N-major in 64-byte swizzled smem; 256x192:
    192 accumulator registers per thread) over M, N and K tails."""
    a = torch.randn(300, 1000, device="cuda", dtype=torch.bfloat16)
    b = operand_b(1000, 1000, torch.bfloat16, b_t)
    ((description, out),) = template_outputs("mm", [a, b], (300, 1000), config_list=[cfg])
    assert relative_error(out, a.double() @ b.double()) < TOLERANCE, description


def test_bmm_matches_float64():
    a = torch.randn(3, 200, 72, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(3, 72, 136, device="cuda", dtype=torch.bfloat16)
    ref = a.double() @ b.double()
    for description, out in template_outputs("bmm", [a, b], (3, 200, 136)):
        assert relative_error(out, ref) < TOLERANCE, description


def test_bmm_with_a_broadcast_operand_matches_float64():
    """A batch stride of 0 (one weight for every batch, an expand) passes the checks, so
    choices are offered for it: their TMA descriptors must handle the zero stride."""
    a = torch.randn(3, 200, 72, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(72, 136, device="cuda", dtype=torch.bfloat16).expand(3, 72, 136)
    ref = a.double() @ b.double()
    for description, out in template_outputs("bmm", [a, b], (3, 200, 136)):
        assert relative_error(out, ref) < TOLERANCE, description


def check_addmm_bias_alpha_beta(m, n, k, **choices):
    """addmm with a bias vector, alpha 0.5 and beta 2 (``choices``: template_outputs')."""
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = operand_b(k, n, torch.bfloat16, True)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    ref = 2.0 * bias.double() + 0.5 * (a.double() @ b.double())
    for description, out in template_outputs("addmm", [bias.expand(m, n), a, b], (m, n),
                                              alpha=0.5, beta=2.0, **choices):
        assert relative_error(out, ref) < TOLERANCE, description


def test_addmm_bias_alpha_beta_match_float64():
    check_addmm_bias_alpha_beta(260, 512, 128)


# -- swap-AB (C^T = B A^T, small M) through the template ------------------------------

def swap_ab_configs(m, split_k=1):
    from cutedsl_inductor.kernels.gemm.heuristic import swap_ab_configs

    configs = swap_ab_configs(m)
    return [c.replace(split_k=split_k) for c in configs] if split_k > 1 else configs


SWAP_AB_CASES = [  # (M, N, K, dtype, A transposed, B transposed): tiles of 16 and 32
    (16, 4096, 4096, torch.bfloat16, False, True),
    (29, 264, 1000, torch.float16, False, False),  # M, N and K tails
    (24, 4104, 72, torch.bfloat16, True, True),  # A^T: the kernel's B N-major
]


@pytest.mark.parametrize("m,n,k,dtype,a_t,b_t", SWAP_AB_CASES)
def test_swap_ab_configs_match_float64(m, n, k, dtype, a_t, b_t):
    a, b = operand_a(m, k, dtype, a_t), operand_b(k, n, dtype, b_t)
    ref = a.double() @ b.double()
    configs = swap_ab_configs(m) + (swap_ab_configs(m, split_k=2)[:2] if m == 16 else [])
    outputs = list(template_outputs("mm", [a, b], (m, n), configs=len(configs),
                                    config_list=configs))
    assert len(outputs) == len(configs)
    for description, out in outputs:
        assert "SWAP_AB=True" in description
        assert relative_error(out, ref) < TOLERANCE, description


def test_swap_ab_addmm_and_bmm_match_float64():
    check_addmm_bias_alpha_beta(16, 520, 256, configs=2, config_list=swap_ab_configs(16)[:2])
    a3 = torch.randn(3, 5, 72, device="cuda", dtype=torch.bfloat16)
    b3 = torch.randn(3, 72, 136, device="cuda", dtype=torch.bfloat16)
    for description, out in template_outputs("bmm", [a3, b3], (3, 5, 136), configs=2,
                                              config_list=swap_ab_configs(5)[2:4]):
        assert relative_error(out, a3.double() @ b3.double()) < TOLERANCE, description


# -- torch.compile end to end ------------------------------------------------------


def compile_with(backends, fn, *args):
    from torch._inductor import select_algorithm
    from torch._inductor.utils import run_and_get_code

    timings = {}

    def save(choice_timings, name, *rest):
        timings.update({c: t for c, t in choice_timings.items()})

    select_algorithm.add_feedback_saver(save)
    torch._dynamo.reset()
    try:
        with torch._inductor.config.patch(max_autotune=True, max_autotune_gemm_backends=backends,
                                          fx_graph_cache=False), config.patch(gemm_max_configs=3):
            result, codes = run_and_get_code(torch.compile(fn), *args)
    finally:
        select_algorithm.clear_feedback_savers()
    return result, "\n".join(codes), timings


def test_compile_picks_the_fastest_choice():
    x = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    result, code, timings = compile_with("ATEN,CUTEDSL", lambda p, q: p @ q.t(), x, w)
    assert relative_error(result, x.double() @ w.double().t()) < TOLERANCE
    ours = {c: t for c, t in timings.items() if "CuteDSL" in (c.description or "")}
    assert ours, "no CuteDSL choice was benchmarked"
    assert all(t < float("inf") for t in ours.values()), ours
    best = min(timings, key=timings.get)
    assert ("cutedsl_sm90_gemm" in code) == (best in ours)
    # timed in this order: ours first (after settling the clock), then ATen's
    assert next(iter(timings)) in ours


def test_settling_runs_the_call_back_to_back_before_timing():
    from cutedsl_inductor.autotune.benchmark_request import fastest_ms

    x = torch.zeros((), device="cuda")
    count_call = functools.partial(x.add_, 1)
    readings = iter([3.0, 2.0])
    assert fastest_ms(lambda: next(readings), count_call, settle_ms=50, device=x.device) == 2.0
    calls = int(x.item())
    assert calls >= 8 and calls % 8 == 0  # whole batches between synchronizes
    assert fastest_ms(lambda: 1.0, count_call, settle_ms=0, device=x.device) == 1.0
    assert x.item() == calls


@pytest.mark.parametrize("op", ["addmm", "bmm"])
def test_compile_addmm_and_bmm_with_cutedsl_only(op):
    if op == "addmm":
        args = (torch.randn(768, device="cuda", dtype=torch.bfloat16),
                torch.randn(512, 256, device="cuda", dtype=torch.bfloat16),
                torch.randn(768, 256, device="cuda", dtype=torch.bfloat16))

        def fn(bias, x, w):
            return torch.addmm(bias, x, w.t(), beta=0.5, alpha=2.0)

        ref = 0.5 * args[0].double() + 2.0 * (args[1].double() @ args[2].double().t())
    else:
        args = (torch.randn(4, 256, 128, device="cuda", dtype=torch.float16),
                torch.randn(4, 128, 320, device="cuda", dtype=torch.float16))
        fn = torch.bmm
        ref = args[0].double() @ args[1].double()
    result, code, _ = compile_with("CUTEDSL", fn, *args)
    assert "cutedsl_sm90_gemm" in code
    assert relative_error(result, ref) < TOLERANCE


def test_autotuning_in_a_subprocess_times_our_choices_there():
    """TORCHINDUCTOR_AUTOTUNE_IN_SUBPROC: our choices are timed in Inductor's tuning
    process (from their picklable bmreq) and one of them can win. Inductor's autotune
    cache is off: an earlier test's in-process timings of these choices would answer."""
    x = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    with torch._inductor.config.patch(autotune_in_subproc=True, autotune_local_cache=False):
        result, code, timings = compile_with("CUTEDSL", lambda p, q: p @ q.t(), x, w)
    assert "cutedsl_sm90_gemm" in code
    assert relative_error(result, x.double() @ w.double().t()) < TOLERANCE
    assert timings and all(t < float("inf") for t in timings.values()), timings
    assert "CuteDSL" in next(iter(timings)).description  # the one that settles the clock


def test_dynamic_batch_sizes_run_our_symbolic_kernel():
    """A dynamic M (mark_dynamic): one graph serves every M >= 2 with our GEMM; M = 1,
    which dynamo specializes, gets its own graph, whose binary also takes M at run time.
    (Output code is collected as run_and_get_code does, without its dynamo reset.)"""
    from unittest import mock

    from torch._dynamo.utils import counters
    from torch._inductor.graph import GraphLowering

    w = torch.randn(384, 512, device="cuda", dtype=torch.bfloat16)
    torch._dynamo.reset()
    counters.clear()
    codes = []
    compiled = torch.compile(lambda x: x @ w.t())
    with torch._inductor.config.patch(max_autotune=True, max_autotune_gemm_backends="CUTEDSL",
                                      fx_graph_cache=False), config.patch(gemm_max_configs=2), \
            mock.patch.object(GraphLowering, "save_output_code", codes.append):
        for m in (17, 256, 1000, 1):
            x = torch.randn(m, 512, device="cuda", dtype=torch.bfloat16)
            if m > 1:
                torch._dynamo.maybe_mark_dynamic(x, 0)
            result = compiled(x)
            assert relative_error(result, x.double() @ w.double().t()) < TOLERANCE, m
    assert counters["stats"]["unique_graphs"] == 2  # nothing specialized M = 17
    assert len(codes) == 2 and all("cutedsl_sm90_gemm" in code for code in codes)


def test_compile_falls_back_where_it_does_not_apply():
    x, w = (torch.randn(256, 256, device="cuda") for _ in range(2))
    result, code, _ = compile_with("ATEN,CUTEDSL", torch.mm, x, w)
    assert "cutedsl_sm90_gemm" not in code
    torch.testing.assert_close(result, x @ w)


# -- split-K (cluster K split with a DSMEM reduction), kernels called directly --------

SPLIT_K_TILES = {
    "64x128": dict(tile_m=64, tile_n=128, tile_k=64, cooperative=False, raster="n"),
    "128x128": dict(tile_m=128, tile_n=128, tile_k=64, cooperative=True, raster="m"),
}


@functools.lru_cache(maxsize=None)
def split_k_kernel(tile, split_k, store, a_major, b_major, bias_dtype=None,
                   max_active_clusters=None, cluster=(1, 1)):
    from cutedsl_inductor.kernels.gemm.standalone import compile_sm90_gemm

    cfg = dict(SPLIT_K_TILES[tile], split_k=split_k, store=store, cluster_m=cluster[0],
               cluster_n=cluster[1])
    return compile_sm90_gemm(cfg, "bf16", "bf16", a_major, b_major, bias_dtype=bias_dtype,
                             max_active_clusters=max_active_clusters or None)


def kernel_operand(rows, cols, l, major, dtype=torch.bfloat16, fill="randn", pad=8):
    """A (rows, cols, L) view in the kernel's convention, and the allocation behind it:
    the leading dimension is padded to 16 bytes plus ``pad`` elements (rounded up to 8),
    so that writes past the view are detectable."""
    inner = cols if major == "k" else rows
    ld = (inner + 7) // 8 * 8 + (pad + 7) // 8 * 8
    store = torch.empty((l, rows if major == "k" else cols, ld), device="cuda", dtype=dtype)
    if fill == "nan":
        store.fill_(float("nan"))
    else:
        store.copy_(torch.randn(store.shape, device="cuda"))
    view = store[:, :, :inner]
    return (view.permute(1, 2, 0) if major == "k" else view.permute(2, 1, 0)), store


def run_split_k(m, n, k, l, split_k, a_major="k", b_major="k", bias=None, alpha=1.0,
                beta=0.0, max_active_clusters=None, cluster=(1, 1)):
    """Run one split-K kernel into a NaN-poisoned C; check it against float64, and that
    nothing outside C's view was written."""
    store = "direct" if n % 128 else "tma"  # N = 200: the direct store, partial N tile
    tile = "64x128" if m <= 64 else "128x128"
    a, _ = kernel_operand(m, k, l, a_major)
    b, _ = kernel_operand(n, k, l, b_major)
    c, c_store = kernel_operand(m, n, l, "k", fill="nan")
    bias_t = None
    if bias == "row":
        vec = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        bias_t = vec.as_strided((m, n, l), (0, 1, 0))
    elif bias == "full":
        bias_t = torch.randn(l, m, n, device="cuda", dtype=torch.bfloat16).permute(1, 2, 0)
    fn = split_k_kernel(tile, split_k, store, a_major, b_major,
                        "bf16" if bias else None, max_active_clusters, cluster)
    fn(a, b, c, bias_t, alpha, beta)
    torch.cuda.synchronize()
    ref = torch.einsum("mkl,nkl->mnl", a.double(), b.double()) * alpha
    if bias_t is not None:
        ref = ref + beta * bias_t.double()
    what = (f"{m}x{n}x{k} L={l} split_k={split_k} cluster={cluster} {tile} {store} "
            f"A{a_major} B{b_major} {bias}")
    assert relative_error(c, ref) < TOLERANCE, what
    assert torch.isnan(c_store[:, :, n:]).all(), f"wrote past N: {what}"


SPLIT_K_M = [1, 16, 64, 100, 128, 256]
SPLIT_K_NK = [(n, k) for n in (4096, 200) for k in (4096, 14336, 100, 8)]


@pytest.mark.parametrize("split_k", [2, 4])
@pytest.mark.parametrize("n,k", SPLIT_K_NK)
@pytest.mark.parametrize("m", SPLIT_K_M)
def test_split_k_mm_matches_float64(m, n, k, split_k):
    # Both transposes: A M-major needs M % 8 == 0 (16-byte leading dimension).
    a_major = "m" if m % 8 == 0 and k in (14336, 100) else "k"
    b_major = "n" if k in (4096, 100) else "k"
    run_split_k(m, n, k, 1, split_k, a_major, b_major)


@pytest.mark.parametrize("split_k", [2, 4])
@pytest.mark.parametrize("bias", ["row", "full"])
@pytest.mark.parametrize("m,n", [(100, 4096), (256, 200)])
def test_split_k_addmm_bias_alpha_beta(m, n, bias, split_k):
    run_split_k(m, n, 4096, 1, split_k, "k", "n", bias=bias, alpha=0.5, beta=2.0)


@pytest.mark.parametrize("split_k", [2, 4])
@pytest.mark.parametrize("m,n,k", [(64, 4096, 4096), (100, 200, 1000)])
def test_split_k_bmm_matches_float64(m, n, k, split_k):
    run_split_k(m, n, k, 3, split_k, "k", "k")
    run_split_k(m if m % 8 == 0 else 104, n, k, 3, split_k, "m", "n", bias="full",
                alpha=1.5, beta=-1.0)


@pytest.mark.parametrize("split_k", [2, 4])
def test_split_k_persistent_loop_reuses_the_reduction_buffer(split_k):
    """Three clusters walk many tiles each: the buffer hand-over across tiles."""
    run_split_k(256, 4096, 4096, 2, split_k, "k", "k", max_active_clusters=3)
    run_split_k(64, 200, 14336, 3, split_k, "m", "n", bias="row", beta=1.0,
                max_active_clusters=3)


@pytest.mark.parametrize("cluster", [(2, 1), (1, 2)])
@pytest.mark.parametrize("split_k", [2, 4])
@pytest.mark.parametrize("m,n,k", [(1, 4096, 4096), (100, 200, 14336), (256, 4096, 14336),
                                   (128, 4096, 8), (200, 264, 1000)])
def test_split_k_with_multicast_clusters_matches_float64(m, n, k, split_k, cluster):
    """Split-K clusters that also multicast A (along N) or B (along M): M/N/K tails,
    a single M or N tile (the partner CTA's tile is empty), both transposes."""
    a_major = "m" if m % 8 == 0 and k == 14336 else "k"
    run_split_k(m, n, k, 1, split_k, a_major, "n" if k == 4096 else "k", cluster=cluster)


@pytest.mark.parametrize("cluster", [(2, 1), (1, 2)])
@pytest.mark.parametrize("split_k", [2, 4])
def test_split_k_with_multicast_clusters_bias_batch_and_persistent_walk(split_k, cluster):
    run_split_k(100, 4096, 4096, 1, split_k, "k", "n", bias="row", alpha=0.5, beta=2.0,
                cluster=cluster)
    run_split_k(256, 4096, 4096, 2, split_k, "k", "k", bias="full", beta=-1.0,
                max_active_clusters=3, cluster=cluster)
    run_split_k(64, 200, 14336, 3, split_k, "m", "n", max_active_clusters=2, cluster=cluster)


def test_split_k_choice_through_the_template():
    """The heuristic's first choice for a small-M problem is split-K and is correct."""
    a = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    b = operand_b(4096, 4096, torch.bfloat16, True)
    ref = a.double() @ b.double()
    descriptions = []
    for description, out in template_outputs("mm", [a, b], (64, 4096), configs=2):
        assert relative_error(out, ref) < TOLERANCE, description
        descriptions.append(description)
    assert "SPLIT_K" in descriptions[0]


@pytest.mark.parametrize("m", [16, 64, 128, 256])
@pytest.mark.parametrize("n,k", [(4096, 4096), (14336, 4096), (4096, 14336)])
def test_the_split_and_unsplit_configs_ranked_first_at_small_m_match_float64(m, n, k):
    """At an LLM's small-M shapes (bf16, x @ w.T) the heuristic's first three split-K and
    first three unsplit configs, through the template."""
    from cutedsl_inductor.kernels.gemm.heuristic import pick_configs

    ranked = pick_configs(m, n, k, "bf16", max_configs=32)
    configs = ([c for c in ranked if c.split_k > 1][:3]
               + [c for c in ranked if c.split_k == 1][:3])
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = operand_b(k, n, torch.bfloat16, True)
    ref = a.double() @ b.double()
    outputs = list(template_outputs("mm", [a, b], (m, n), configs=len(configs),
                                    config_list=configs))
    assert len(outputs) == len(configs)
    for description, out in outputs:
        assert relative_error(out, ref) < TOLERANCE, description


# -- every config called directly over a set of cases ---------------------------------

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# (name, m, n, k, l, a_major, b_major, ab, out, bias, alpha, beta, pad)
# bias: None | "row" (addmm vector, stride 0 along M) | "full" (M x N x L); pad: extra
# elements in every leading dimension (lda != K)
KERNEL_CASES = [
    ("square1000", 1000, 1000, 1000, 1, "k", "k", "bf16", "bf16", None, 1.0, 0.0, 0),
    ("tails129x257x65", 129, 257, 65, 1, "k", "k", "bf16", "bf16", None, 1.0, 0.0, 7),
    ("batched_L3", 200, 136, 320, 3, "k", "k", "bf16", "bf16", None, 1.0, 0.0, 0),
    ("a_m_major", 1000, 1000, 1000, 1, "m", "k", "bf16", "bf16", None, 1.0, 0.0, 0),
    ("b_n_major", 1000, 1000, 1000, 1, "k", "n", "bf16", "bf16", None, 1.0, 0.0, 0),
    ("both_mn_major_tails", 129, 257, 65, 2, "m", "n", "bf16", "bf16", None, 1.0, 0.0, 7),
    ("row_bias_alpha_beta", 1000, 1000, 1000, 1, "k", "n", "bf16", "bf16", "row", 0.5, 2.0, 0),
    ("full_bias_batched", 129, 257, 65, 3, "k", "k", "bf16", "bf16", "full", 1.5, -1.0, 7),
    ("fp16", 1000, 1000, 1000, 1, "k", "k", "fp16", "fp16", None, 1.0, 0.0, 0),
    ("fp32_out_bias", 129, 257, 65, 1, "k", "k", "bf16", "fp32", "row", 1.0, 1.0, 7),
    ("k_tiny", 300, 500, 8, 1, "k", "k", "bf16", "bf16", None, 1.0, 0.0, 0),
]

_KERNELS = {}


def check_kernel(cfg, case, max_active_clusters=None):
    """Compile ``cfg`` for ``case`` (cached; the direct store where C's rows are not
    16-byte multiples) and run it there: NaN-poisoned padded output, float64 reference
    (relative error < 1e-2 for 16-bit outputs, 1e-4 for fp32), nothing written past N."""
    from cutedsl_inductor.kernels.gemm.standalone import compile_sm90_gemm

    (name, m, n, k, l, a_major, b_major, ab, out, bias_kind, alpha, beta, pad) = case
    cfg = cfg.replace(store="direct" if (n * DTYPES[out].itemsize) % 16 else cfg.store)
    bias_dtype = out if bias_kind else None
    key = (cfg, max_active_clusters, ab, out, a_major, b_major, bias_dtype)
    if key not in _KERNELS:
        _KERNELS[key] = compile_sm90_gemm(cfg, ab, out, a_major, b_major, bias_dtype,
                                          max_active_clusters=max_active_clusters)
    a, _ = kernel_operand(m, k, l, a_major, DTYPES[ab], pad=pad)
    b, _ = kernel_operand(n, k, l, b_major, DTYPES[ab], pad=pad)
    c, c_store = kernel_operand(m, n, l, "k", DTYPES[out], fill="nan", pad=pad)
    bias = None
    if bias_kind == "row":
        bias = torch.randn(n, device="cuda").to(DTYPES[out]).as_strided((m, n, l), (0, 1, 0))
    elif bias_kind == "full":
        bias = torch.randn((l, m, n), device="cuda").to(DTYPES[out]).permute(1, 2, 0)
    _KERNELS[key](a, b, c, bias, alpha, beta)
    torch.cuda.synchronize()
    ref = torch.einsum("mkl,nkl->mnl", a.double(), b.double()) * alpha
    if bias is not None:
        ref = ref + beta * bias.double()
    what = f"{cfg.name} {name} {m}x{n}x{k} L={l}"
    assert relative_error(c, ref) < (1e-4 if out == "fp32" else TOLERANCE), what
    assert torch.isnan(c_store[:, :, n:]).all(), f"wrote past N: {what}"


@pytest.mark.parametrize("case", KERNEL_CASES, ids=lambda case: case[0])
@pytest.mark.parametrize("cfg", [c for c in DEFAULT_CONFIGS if not c.pingpong],
                         ids=lambda c: c.name)
def test_default_configs_match_float64(cfg, case):
    """Every cooperative and one-warpgroup default config (the ping-pong ones: below)
    over tails, padded leading dimensions, batches, every operand major, bias with alpha
    and beta, fp16 and an fp32 output."""
    check_kernel(cfg, case)


# -- ping-pong consumer scheduling: the kernel called directly ---------------------

def pingpong_configs():
    return [c for c in DEFAULT_CONFIGS + EXTRA_CONFIGS if c.pingpong]


@pytest.mark.parametrize("cfg_idx", range(4))
def test_pingpong_random_shapes_match_float64(cfg_idx):
    cfg = pingpong_configs()[cfg_idx]
    rng = random.Random(cfg_idx)
    for i in range(6):
        a_major, b_major = rng.choice("km"), rng.choice("kn")
        m = rng.randint(1, 1500)  # leading dimensions are padded to 16 bytes
        n, k, l = rng.randint(1, 1500), 8 * rng.randint(1, 300), rng.choice([1, 1, 2])
        pad = rng.choice([0, 8])
        check_kernel(cfg, (f"random{i}", m, n, k, l, a_major, b_major, "bf16", "bf16",
                           None, 1.0, 0.0, pad))


@pytest.mark.parametrize("cfg_idx", range(4))
@pytest.mark.parametrize("case", [
    ("row_bias_alpha_beta", 1000, 1000, 1000, 1, "k", "n", "bf16", "bf16", "row", 0.5, 2.0, 0),
    ("full_bias_batched", 129, 257, 65, 3, "k", "k", "bf16", "bf16", "full", 1.5, -1.0, 7),
    ("fp32_out_bias", 300, 264, 520, 2, "m", "n", "bf16", "fp32", "row", 1.0, 1.0, 8),
    ("fp16", 777, 512, 256, 1, "k", "k", "fp16", "fp16", None, 1.0, 0.0, 0),
], ids=lambda c: c[0] if isinstance(c, tuple) else None)
def test_pingpong_addmm_bmm_dtypes_match_float64(cfg_idx, case):
    check_kernel(pingpong_configs()[cfg_idx], case)


@pytest.mark.parametrize("cfg_idx", range(4))
@pytest.mark.parametrize("clusters", [1, 2, 3, None])
def test_pingpong_tile_counts_per_cta(cfg_idx, clusters):
    """Few persistent clusters (``max_active_clusters``) over 1..7 tiles each, so that a
    warpgroup gets no tile, both get the same number, or one gets one more; with
    K long enough for many more k-tiles than ring stages, and K of one k-tile."""
    cfg = pingpong_configs()[cfg_idx]
    tm, tn = cfg.tile_m * cfg.cluster_m, cfg.tile_n * cfg.cluster_n
    for tiles_m, tiles_n, k in [(1, 1, 64), (1, 1, 4096), (2, 1, 2048), (1, 3, 1000),
                                (3, 2, 2056), (7, 1, 40), (2, 5, 3000)]:
        m, n = tiles_m * tm - 3, tiles_n * tn - 8
        check_kernel(cfg, (f"{tiles_m}x{tiles_n}_clusters_k{k}", m, n, k, 1, "k", "k",
                           "bf16", "bf16", None, 1.0, 0.0, 0), max_active_clusters=clusters)


@pytest.mark.parametrize("cfg_idx", range(4))
def test_pingpong_large_matches_float64(cfg_idx):
    check_kernel(pingpong_configs()[cfg_idx], ("large", 4096, 4096, 4096, 1, "k", "k",
                                               "bf16", "bf16", None, 1.0, 0.0, 0))
    check_kernel(pingpong_configs()[cfg_idx], ("large_batched", 2048, 3072, 1024, 3, "m", "n",
                                               "bf16", "bf16", "full", 1.0, 1.0, 0))


# -- the epilogue hook's coordinates: a coordinate-dependent fused epilogue ----------

def coordinate_gemm_class():
    """Sm90Gemm whose epilogue, after the default (alpha, bias, beta), adds
    ``l * 500000 + m * 1000 + n + row[m] + col[n]``: any wrong, missing or repeated
    coordinate shows up in an fp32 output."""
    import cutlass
    import cutlass.cute as cute

    from cutedsl_inductor.kernels.gemm.sm90_gemm import Sm90Gemm

    class CoordinateGemm(Sm90Gemm):
        @cute.jit
        def __call__(self, mA, mB, mC, mBias, mRow, mCol, alpha, beta, stream):
            self.launch(mA, mB, mC, mBias, alpha, beta, stream, epi_args=(mRow, mCol))

        @cute.jit
        def epilogue_op(self, acc, coords, l_idx, prob_m, prob_n, mBias, alpha, beta, epi_args,
                        prefetched):
            Sm90Gemm.epilogue_op(self, acc, coords, l_idx, prob_m, prob_n, mBias, alpha, beta,
                                 epi_args, prefetched)
            row, col = epi_args
            for i in cutlass.range(cute.size(acc), unroll_full=True):
                m, n = coords[i][0], coords[i][1]
                v = acc[i] + (l_idx * 500000 + m * 1000 + n).to(cutlass.Float32)
                if m < prob_m:
                    v = v + row[m]
                if n < prob_n:
                    v = v + col[n]
                acc[i] = v

    return CoordinateGemm


@functools.lru_cache(maxsize=None)
def compile_coordinate_gemm(cfg_items):
    """Compile ``coordinate_gemm_class()`` for a config (a tuple of dict items): bf16
    operands, fp32 C, fp32 full bias, fp32 row/column vectors; called as
    ``f(A, B, C, Bias, row, col, alpha, beta)``."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor
    from cutlass.runtime import make_fake_stream

    from cutedsl_inductor.kernels.gemm.standalone import make_fake_gemm_args

    cfg = dict(cfg_items)
    a, b, c, bias = make_fake_gemm_args("bf16", "fp32", "k", "k", bias_dtype="fp32",
                                        store=cfg.get("store", "tma"))
    row = make_fake_tensor(cutlass.Float32, (cute.sym_int32(),), (1,))
    col = make_fake_tensor(cutlass.Float32, (cute.sym_int32(),), (1,))
    return cute.compile(coordinate_gemm_class()(**cfg), a, b, c, bias, row, col,
                        cutlass.Float32(1.0), cutlass.Float32(0.0),
                        make_fake_stream(use_tvm_ffi_env_stream=True),
                        options="--enable-tvm-ffi")


COORDINATE_CONFIGS = {
    "coop_128x256_c2x1": dict(tile_m=128, tile_n=256, tile_k=64, cluster_m=2, cooperative=True),
    "coop_256x128_c1x2": dict(tile_m=256, tile_n=128, tile_k=64, cluster_n=2, cooperative=True,
                              raster="n"),
    "1wg_64x256": dict(tile_m=64, tile_n=256, tile_k=64, cooperative=False, raster="n"),
    "1wg_128x64": dict(tile_m=128, tile_n=64, tile_k=64, cooperative=False),
    "pp_128x128_c2x1": dict(tile_m=128, tile_n=128, tile_k=64, cluster_m=2, cooperative=False,
                            pingpong=True, max_active_clusters=2),
    "pp_64x256": dict(tile_m=64, tile_n=256, tile_k=64, cooperative=False, pingpong=True,
                      raster="n", max_active_clusters=3),
    "splitk2_64x128": dict(tile_m=64, tile_n=128, tile_k=64, cooperative=False, raster="n",
                           split_k=2, max_active_clusters=3),
    "splitk4_coop_128x128": dict(tile_m=128, tile_n=128, tile_k=64, cooperative=True,
                                 split_k=4),
}


@pytest.mark.parametrize("store", ["tma", "direct"])
@pytest.mark.parametrize("name", list(COORDINATE_CONFIGS))
def test_epilogue_hook_coordinates_match_float64(name, store):
    """The hook runs per epilogue sub-tile (per chunk for the direct store) on a copy of
    the accumulator; its coordinates must be exactly those of the values it gets, with
    M/N tails, several tiles per CTA (ping-pong: both warpgroups) and batches."""
    cfg = dict(COORDINATE_CONFIGS[name], store=store)
    fn = compile_coordinate_gemm(tuple(sorted(cfg.items())))
    # (M, N, K, L): tails in M and N (N % 4 == 0 for the fp32 TMA store), and N = 257
    # (direct store only).
    shapes = [(300, 264, 200, 1), (129, 520, 72, 2), (64, 128, 1000, 1)]
    if store == "direct":
        shapes.append((77, 257, 136, 2))
    for m, n, k, l in shapes:
        a, _ = kernel_operand(m, k, l, "k")
        b, _ = kernel_operand(n, k, l, "k")
        c, c_store = kernel_operand(m, n, l, "k", dtype=torch.float32, fill="nan")
        bias = torch.randn(l, m, n, device="cuda", dtype=torch.float32).permute(1, 2, 0)
        row = torch.randn(m, device="cuda", dtype=torch.float32)
        col = torch.randn(n, device="cuda", dtype=torch.float32)
        alpha, beta = 0.5, 2.0
        fn(a, b, c, bias, row, col, alpha, beta)
        torch.cuda.synchronize()
        mm = torch.einsum("mkl,nkl->mnl", a.double(), b.double())
        ms = torch.arange(m, device="cuda", dtype=torch.float64).view(m, 1, 1)
        ns = torch.arange(n, device="cuda", dtype=torch.float64).view(1, n, 1)
        ls = torch.arange(l, device="cuda", dtype=torch.float64).view(1, 1, l)
        ref = (alpha * mm + beta * bias.double() + ls * 500000 + ms * 1000 + ns
               + row.double().view(m, 1, 1) + col.double().view(1, n, 1))
        what = f"{name} {store} {m}x{n}x{k} L={l}"
        assert not torch.isnan(c).any(), f"unwritten outputs: {what}"
        err = (c.double() - ref).abs()
        worst = tuple(int(i) for i in torch.nonzero(err == err.max())[0])
        assert err.max().item() < 0.25, f"{what}: max error {err.max().item()} at {worst}"
        assert torch.isnan(c_store[:, :, n:]).all(), f"wrote past N: {what}"


TILE_INPUT_CONFIGS = {
    "coop_128x256_c2x1": dict(tile_m=128, tile_n=256, tile_k=64, cluster_m=2, cooperative=True,
                              max_active_clusters=2),
    "coop_256x128_c1x2": dict(tile_m=256, tile_n=128, tile_k=64, cluster_n=2, cooperative=True,
                              raster="n"),
    "pp_128x128_c2x1": dict(tile_m=128, tile_n=128, tile_k=64, cluster_m=2, cooperative=False,
                            pingpong=True, max_active_clusters=2),
    "1wg_64x64": dict(tile_m=64, tile_n=64, tile_k=64, cooperative=False, raster="n",
                      max_active_clusters=3),
}


@functools.lru_cache(maxsize=None)
def residual_kernel(name):
    from tests.helpers import compile_residual_gemm

    return compile_residual_gemm(TILE_INPUT_CONFIGS[name])


@pytest.mark.parametrize("name", list(TILE_INPUT_CONFIGS))
def test_tile_input_residual_matches_float64(name):
    """C = A @ B^T + R, R loaded by TMA into the store buffers ahead of each sub-tile
    (across tile boundaries, per warpgroup with ping-pong): M/N tails, several tiles per
    CTA (capped persistent grids), batches; NaN-poisoned C."""
    fn = residual_kernel(name)
    for m, n, k, l in [(300, 264, 200, 1), (129, 520, 72, 2), (1000, 1000, 64, 1)]:
        a, _ = kernel_operand(m, k, l, "k")
        b, _ = kernel_operand(n, k, l, "k")
        r, _ = kernel_operand(m, n, l, "k")
        c, c_store = kernel_operand(m, n, l, "k", fill="nan")
        fn(a, b, c, r)
        torch.cuda.synchronize()
        ref = torch.einsum("mkl,nkl->mnl", a.double(), b.double()) + r.double()
        what = f"{name} {m}x{n}x{k} L={l}"
        assert not torch.isnan(c).any(), f"unwritten outputs: {what}"
        assert relative_error(c, ref) < TOLERANCE, what
        assert torch.isnan(c_store[:, :, n:]).all(), f"wrote past N: {what}"
