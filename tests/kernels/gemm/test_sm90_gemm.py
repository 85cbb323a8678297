"""GPU-less compile tests of the Hopper GEMM template (real sm_90a compiles, no mocks)."""

import os

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import pytest  # noqa: E402

cutlass = pytest.importorskip("cutlass")
import cutlass.cute as cute  # noqa: E402

from cutedsl_inductor.kernels.gemm.config import GemmConfig, config_error  # noqa: E402
from cutedsl_inductor.kernels.gemm.heuristic import (  # noqa: E402
    DEFAULT_CONFIGS,
    pick_configs,
)
from cutedsl_inductor.kernels.gemm.heuristic import (
    EXTRA_CONFIGS as _EXTRA_CONFIGS,
)
from cutedsl_inductor.kernels.gemm.sm90_gemm import Sm90Gemm  # noqa: E402
from cutedsl_inductor.kernels.gemm.standalone import compile_sm90_gemm  # noqa: E402


def config_name(cfg):
    """A config's name; for a test's literal fields (some given ``store="direct"`` by the
    test itself) that of the config they name."""
    if isinstance(cfg, GemmConfig):
        return cfg.name
    return GemmConfig(**cfg).name if config_error(**cfg) is None else GemmConfig(
        **dict(cfg, store="direct")).name


def _with(cfg, **changes):
    return cfg.replace(**changes) if isinstance(cfg, GemmConfig) else {**cfg, **changes}


PINGPONG_CONFIGS = [c for c in DEFAULT_CONFIGS + _EXTRA_CONFIGS if c.pingpong]
TILE_INPUT_CONFIGS = {
    "coop_128x256_c2x1": dict(tile_m=128, tile_n=256, tile_k=64, cluster_m=2, cooperative=True),
    "pp_128x128_c2x1": dict(tile_m=128, tile_n=128, tile_k=64, cluster_m=2, cooperative=False,
                            pingpong=True),
    "1wg_64x64": dict(tile_m=64, tile_n=64, tile_k=64, cooperative=False, raster="n"),
}


@pytest.mark.parametrize("cfg", DEFAULT_CONFIGS + _EXTRA_CONFIGS,
                         ids=[config_name(c) for c in DEFAULT_CONFIGS + _EXTRA_CONFIGS])
def test_heuristic_config_compiles_bf16_symbolic(cfg):
    fn = compile_sm90_gemm(cfg, "bf16", "bf16", "k", "k")
    assert callable(fn)


@pytest.mark.parametrize("a_major,b_major", [("m", "k"), ("k", "n"), ("m", "n")])
def test_operand_majors_compile(a_major, b_major):
    compile_sm90_gemm(DEFAULT_CONFIGS[0], "bf16", "bf16", a_major, b_major)


@pytest.mark.parametrize(
    "cfg_idx,ab,out,bias",
    [(5, "fp16", "fp16", None), (3, "bf16", "bf16", "bf16"), (7, "bf16", "fp32", "fp32")],
    ids=["fp16", "bf16_bias", "fp32_out_bias"],
)
def test_dtype_and_bias_variants_compile(cfg_idx, ab, out, bias):
    compile_sm90_gemm(DEFAULT_CONFIGS[cfg_idx], ab, out, "k", "n", bias_dtype=bias)


def test_epilogue_hook_override_compiles():
    """A fused `relu(alpha * acc) * scale[n]` with an extra per-column tensor."""
    from cutlass.cute.runtime import make_fake_tensor
    from cutlass.runtime import make_fake_stream

    from cutedsl_inductor.kernels.gemm.standalone import make_fake_gemm_args

    class ScaledReluGemm(Sm90Gemm):
        @cute.jit
        def __call__(self, mA, mB, mC, mScale, alpha, stream):
            self.launch(mA, mB, mC, None, alpha, cutlass.Float32(0.0), stream,
                        epi_args=(mScale,))

        @cute.jit
        def epilogue_op(self, acc, coords, l_idx, prob_m, prob_n, mBias, alpha, beta, epi_args,
                        prefetched):
            m_scale = epi_args[0]
            for i in cutlass.range(cute.size(acc), unroll_full=True):
                v = max(acc[i] * alpha, cutlass.Float32(0.0))
                if coords[i][1] < prob_n:
                    v = v * m_scale[coords[i][1]].to(cutlass.Float32)
                acc[i] = v

    a, b, c, _ = make_fake_gemm_args()
    scale = make_fake_tensor(cutlass.Float32, (cute.sym_int32(),), (1,))
    cute.compile(ScaledReluGemm(DEFAULT_CONFIGS[5]), a, b, c, scale, cutlass.Float32(1.0),
                 make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")


def _ptx_of(gemm, directory):
    """The PTX of ``gemm`` compiled GPU-less (bf16, K-major operands, no bias)."""
    from cutlass.runtime import make_fake_stream

    from cutedsl_inductor.kernels.gemm.standalone import make_fake_gemm_args

    directory.mkdir()
    a, b, c, bias = make_fake_gemm_args()
    cute.compile(gemm, a, b, c, bias, cutlass.Float32(1.0), cutlass.Float32(0.0),
                 make_fake_stream(use_tvm_ffi_env_stream=True),
                 options=f"--enable-tvm-ffi --keep-ptx --dump-dir={directory}")
    (ptx,) = directory.glob("*.ptx")
    return ptx.read_text()


def test_epilogue_math_starts_after_the_tiles_last_ring_slot_is_released(tmp_path):
    """With a fusion hook the accumulator copies add a zero derived from a test of the
    released slot's barrier (so ptxas cannot hoist the epilogue above the release); a plain
    GEMM's kernel is left as it was."""
    class Doubled(Sm90Gemm):
        @cute.jit
        def epilogue_op(self, acc, coords, l_idx, prob_m, prob_n, mBias, alpha, beta, epi_args,
                        prefetched):
            for i in cutlass.range(cute.size(acc), unroll_full=True):
                acc[i] = acc[i] * 2.0

    cfg = dict(tile_m=128, tile_n=128, cooperative=True)
    assert Doubled(**cfg).epilogue_math and Sm90Gemm(**cfg, swiglu="b").epilogue_math
    assert not Sm90Gemm(**cfg).epilogue_math
    fused = _ptx_of(Doubled(**cfg), tmp_path / "fused")
    zero_read = fused.index("mul.rn.f32")
    assert "mbarrier.test_wait" in fused[fused.rindex("mbarrier.arrive", 0, zero_read):zero_read]
    assert zero_read < fused.index("stmatrix")
    assert "mul.rn.f32" not in _ptx_of(Sm90Gemm(**cfg), tmp_path / "plain")


def test_pdl_waits_for_the_previous_kernel_before_any_global_access(tmp_path):
    """With ``pdl`` every thread waits (``griddepcontrol.wait``) before the first TMA load
    or global access; without it the kernel has no wait."""
    cfg = DEFAULT_CONFIGS[7]
    launched = _ptx_of(Sm90Gemm(cfg.replace(pdl=True)), tmp_path / "pdl")
    wait = launched.index("griddepcontrol.wait")
    assert wait < launched.index("cp.async.bulk.tensor")
    assert wait < min(launched.index(op) for op in ("ld.global", "st.global", "cp.async.bulk")
                      if op in launched)
    assert "griddepcontrol" not in _ptx_of(Sm90Gemm(cfg), tmp_path / "plain")
    assert cfg.replace(pdl=True).name == cfg.name + "_pdl"


@pytest.mark.parametrize("cfg_idx,bias", [(0, "bf16"), (6, None)])
def test_direct_store_variant_compiles(cfg_idx, bias):
    compile_sm90_gemm(_with(DEFAULT_CONFIGS[cfg_idx], store="direct"), "bf16", "bf16", "m", "n",
                      bias_dtype=bias)


def test_explicit_stages_and_raster_compile():
    compile_sm90_gemm(dict(tile_m=128, tile_n=128, tile_k=64, stages=3, raster="n",
                           group_size=4))


@pytest.mark.parametrize("cfg", PINGPONG_CONFIGS, ids=[config_name(c) for c in PINGPONG_CONFIGS])
@pytest.mark.parametrize("store,a_major,b_major,out,bias", [
    ("tma", "m", "n", "bf16", "bf16"),
    ("direct", "k", "k", "bf16", None),
    ("direct", "m", "n", "fp32", "fp32"),
])
def test_pingpong_variants_compile(cfg, store, a_major, b_major, out, bias):
    compile_sm90_gemm(_with(cfg, store=store), "bf16", out, a_major, b_major, bias_dtype=bias)


def test_pingpong_fp16_compiles():
    compile_sm90_gemm(PINGPONG_CONFIGS[0], "fp16", "fp16", "k", "n")


def test_pingpong_config_names():
    pp = dict(tile_m=128, tile_n=128, cluster_m=2, cooperative=False, pingpong=True)
    assert config_name(pp) == "t128x128x64_c2x1_pp_rm"
    assert config_name(dict(pp, pingpong=False)) == "t128x128x64_c2x1_1wg_rm"
    assert len({config_name(c) for c in DEFAULT_CONFIGS + _EXTRA_CONFIGS}) == len(
        DEFAULT_CONFIGS + _EXTRA_CONFIGS)


@pytest.mark.parametrize("bad", [
    dict(pingpong=True),  # cooperative defaults to True
    dict(tile_m=128, cooperative=True, pingpong=True),
    dict(tile_m=256, cooperative=False, pingpong=True),
    dict(tile_m=128, tile_n=256, cooperative=False, pingpong=True),  # 256 accumulators
    dict(tile_m=128, tile_n=256, tile_k=128, stages=4, cooperative=False, pingpong=True),
])
def test_bad_pingpong_configs_raise_value_error(bad):
    with pytest.raises(ValueError):
        Sm90Gemm(**bad)
    assert config_error(**bad) is not None


@pytest.mark.parametrize("bad", [
    dict(tile_m=64, cooperative=True),
    dict(tile_m=256, cooperative=False),
    dict(tile_m=256, tile_n=256),
    dict(tile_n=160),
    dict(tile_k=48),
    dict(cluster_m=4),
    dict(raster="z"),
    dict(stages=1),
    dict(store="smem"),
    dict(tile_m=128, tile_n=256, tile_k=128, stages=4),
])
def test_bad_configs_raise_value_error(bad):
    with pytest.raises(ValueError):
        Sm90Gemm(**bad)
    assert config_error(**bad) is not None


def test_bad_dtype_is_rejected_at_trace_time():
    from cutlass.cute.runtime import make_fake_compact_tensor
    from cutlass.runtime import make_fake_stream

    a = make_fake_compact_tensor(cutlass.Float32, (128, 64, 1), stride_order=(1, 0, 2))
    b = make_fake_compact_tensor(cutlass.Float32, (128, 64, 1), stride_order=(1, 0, 2))
    c = make_fake_compact_tensor(cutlass.BFloat16, (128, 128, 1), stride_order=(1, 0, 2))
    with pytest.raises(Exception, match="bf16 or fp16"):
        cute.compile(Sm90Gemm(), a, b, c, None, cutlass.Float32(1.0), cutlass.Float32(0.0),
                     make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")


def test_pick_configs():
    for shape in [(4096, 4096, 4096), (128, 8192, 8192), (8192, 14336, 4096), (1, 1, 1)]:
        cfgs = pick_configs(*shape, dtype="bf16", max_configs=8)
        assert 1 <= len(cfgs) <= 8
        for c in cfgs:
            assert config_error(**_fields(c)) is None
            Sm90Gemm(c)
    assert pick_configs(64, 8192, 8192)[0].tile_m == 64
    big = pick_configs(8192, 8192, 8192)[0]
    assert big.tile_m * big.tile_n >= 128 * 256
    assert len(pick_configs(4096, 4096, 4096, max_configs=3)) == 3
    assert all(c.store == "tma" for c in pick_configs(512, 512, 512))
    assert all(c.store == "direct" for c in pick_configs(129, 257, 65))
    assert all(c.store == "direct" for c in pick_configs(129, 258, 65, out_dtype="fp32"))
    assert all(c.store == "tma"
               for c in pick_configs(129, 260, 65, out_dtype="fp32"))


# -- split-K (cluster K split, DSMEM reduction) ----------------------------------------

SPLIT_K_CASES = [  # (config, A major, B major, bias dtype)
    (dict(tile_m=64, tile_n=128, tile_k=64, cooperative=False, raster="n", split_k=2),
     "k", "k", None),
    (dict(tile_m=64, tile_n=128, tile_k=64, cooperative=False, raster="n", split_k=4,
          store="direct"), "m", "n", "bf16"),
    (dict(tile_m=128, tile_n=128, tile_k=64, cooperative=True, raster="m", split_k=4),
     "m", "k", "bf16"),
    (dict(tile_m=128, tile_n=128, tile_k=64, cooperative=True, raster="m", split_k=2,
          store="direct"), "k", "n", None),
    (dict(tile_m=64, tile_n=256, tile_k=64, cooperative=False, raster="n", split_k=8),
     "k", "n", None),
    (dict(tile_m=128, tile_n=128, tile_k=64, cluster_m=2, cooperative=True, raster="m",
          split_k=4), "k", "n", "bf16"),
    (dict(tile_m=64, tile_n=128, tile_k=64, cluster_n=2, cooperative=False, raster="n",
          split_k=2, store="direct"), "m", "k", None),
    (dict(tile_m=64, tile_n=64, tile_k=64, cooperative=False, raster="n", stages=12,
          split_k=2), "k", "k", "bf16"),
]


@pytest.mark.parametrize("cfg,a_major,b_major,bias", SPLIT_K_CASES,
                         ids=[config_name(c[0]) + f"_A{c[1]}_B{c[2]}" for c in SPLIT_K_CASES])
def test_split_k_variants_compile(cfg, a_major, b_major, bias):
    assert callable(compile_sm90_gemm(cfg, "bf16", "bf16", a_major, b_major, bias_dtype=bias))


def test_split_k_fp32_output_compiles():
    cfg = dict(tile_m=64, tile_n=128, tile_k=64, cooperative=False, raster="n", split_k=4)
    compile_sm90_gemm(cfg, "bf16", "fp32", "k", "k", bias_dtype="fp32")


def test_split_k_config_errors():
    assert config_error(split_k=3) is not None
    assert config_error(split_k=16) is not None
    assert "more than 8" in config_error(split_k=8, cluster_m=2)
    assert "more than 8" in config_error(split_k=4, cluster_m=2, cluster_n=2)
    assert config_error(split_k=4, cluster_m=2) is None
    # The fp32 reduction buffer of a 128x256 tile leaves no room for two stages.
    assert "reduction buffer" in config_error(tile_m=128, tile_n=256, split_k=2)
    assert config_error(tile_m=128, tile_n=128, split_k=4) is None
    with pytest.raises(ValueError):
        Sm90Gemm(split_k=8, cluster_n=2)
    # The persistent grid counts whole clusters: cluster_m * cluster_n * split_k CTAs each.
    assert Sm90Gemm(tile_m=128, tile_n=128, split_k=2).max_active_clusters == 132 // 2
    assert Sm90Gemm(tile_m=128, tile_n=128, split_k=4).max_active_clusters < 132 // 4
    assert Sm90Gemm(tile_m=128, tile_n=128, split_k=2, cluster_m=2).max_active_clusters < 132 // 4


@pytest.mark.parametrize("cluster_m,cluster_n,split_k", [(2, 1, 4), (1, 2, 2), (2, 2, 2), (1, 1, 8)])
def test_split_k_cluster_layout(cluster_m, cluster_n, split_k):
    """Every CTA of a split-K cluster gets the (m, n, split rank) of its hardware rank
    (x = m + cluster_m * k, y = n), in the pipeline's view too, and its multicast groups
    (B along M, A along N) hold exactly the CTAs of its own split rank."""
    gemm = Sm90Gemm(tile_m=128, tile_n=128, cluster_m=cluster_m, cluster_n=cluster_n,
                    split_k=split_k)
    size = cluster_m * cluster_n * split_k
    result = {}

    @cute.jit
    def trace():
        layout = gemm.cluster_layout()
        crds = [layout.get_flat_coord(r) for r in range(size)]
        result["crd"] = [tuple(int(x) for x in c) for c in crds]
        result["mask_m"] = [int(cute.make_layout_image_mask(layout, c, mode=0)) for c in crds]
        result["mask_n"] = [int(cute.make_layout_image_mask(layout, c, mode=1)) for c in crds]
        ring = gemm.cluster_layout(vmnk=True)
        result["vmnk"] = [tuple(int(x) for x in cute.flatten(ring.get_hier_coord(r)))
                          for r in range(size)]

    trace()
    crd = result["crd"]
    # the pipeline's view (which CTAs' rings a consumer releases) agrees
    assert result["vmnk"] == [(0, *c) for c in crd]
    for rank, (m, n, k) in enumerate(crd):
        assert rank == (m + cluster_m * k) + cluster_m * split_k * n
        same_k_and_n = {r for r, c in enumerate(crd) if (c[1], c[2]) == (n, k)}
        same_k_and_m = {r for r, c in enumerate(crd) if (c[0], c[2]) == (m, k)}
        assert {r for r in range(size) if result["mask_m"][rank] >> r & 1} == same_k_and_n
        assert {r for r in range(size) if result["mask_n"][rank] >> r & 1} == same_k_and_m


def test_split_k_config_name():
    cfg = dict(tile_m=64, tile_n=128, tile_k=64, cooperative=False, raster="n")
    assert config_name(_with(cfg, split_k=1)) == config_name(cfg) == "t64x128x64_c1x1_1wg_rn"
    assert config_name(_with(cfg, split_k=4, store="direct")) == "t64x128x64_c1x1_1wg_rn_k4_direct"


def test_pick_configs_offers_the_measured_decode_winners():
    """H200 sweeps (bench sweep, nt / nn): at M = 16 swapped tiles were the fastest, the
    64x16 tile with 16 stages at 16x4096x4096 (1.05 / 1.10 of cuBLAS) and 16x4096x14336
    (1.02 / 1.02, split in two 1.01), the 128x16 tile at 16x14336x4096 (1.01 / 1.00) and
    at 16x128256x4096 with the 256x16 tile (1.01 / 1.01), and for the K-major weight (nt)
    the 128x16 tile with a k-tile of 128 at 16x14336x4096 and 16x128256x4096 (1.03, 1.04);
    no split of 8 (always slower than 2) takes their places."""
    shapes = [(16, 4096, 4096), (16, 14336, 4096), (16, 4096, 14336), (16, 128256, 4096)]
    offered = {shape: [config_name(c) for c in pick_configs(*shape)] for shape in shapes}
    assert "t64x16x64_c1x1_1wg_rm_s16_swap" in offered[16, 4096, 4096]
    assert {"t128x16x64_c1x1_1wg_rm_swap",
            "t128x16x64_c1x1_coop_rm_swap"} <= set(offered[16, 14336, 4096])
    assert {"t64x16x64_c2x1_1wg_rm_s16_swap", "t64x16x64_c1x1_1wg_rm_s16_swap",
            "t64x16x64_c1x1_1wg_rm_s16_k2_swap"} <= set(offered[16, 4096, 14336])
    assert "t256x16x64_c1x1_coop_rm_swap" in offered[16, 128256, 4096]
    for shape in ((16, 14336, 4096), (16, 128256, 4096)):
        assert "t128x16x128_c1x1_1wg_rm_swap" in offered[shape]
    assert not any(name.endswith("_k8") for names in offered.values() for name in names)


def test_pick_configs_offers_multicast_weights_where_m_spans_few_tiles():
    """H200 sweeps (bench sweep, nt / nn): two M tiles sharing each B tile by
    multicast were the fastest of all configs at 128x4096x4096 (64x64x128: 1.02 / 0.95 of
    cuBLAS), 128x4096x14336 (1.01 / 0.98) and 256x4096x14336 (128x64: 0.94 / 0.98),
    where the heuristic's best offered reached 0.91-0.93."""
    offered = {shape: [config_name(c) for c in pick_configs(*shape)]
               for shape in [(128, 4096, 4096), (128, 4096, 14336), (256, 4096, 14336)]}
    assert "t64x64x128_c2x1_1wg_rn" in offered[128, 4096, 4096]
    assert "t64x64x128_c2x1_1wg_rn" in offered[128, 4096, 14336]
    assert "t128x64x64_c2x1_1wg_rm" in offered[256, 4096, 14336]


def test_pick_configs_offers_the_64x128_multicast_pair_at_1024_cubed():
    """H200 sweep (bench sweep, bf16, nt / nn): at 1024x1024x1024 the fastest config,
    64x128 tiles in M pairs (0.98 / 0.98 of cuBLAS), beat every config offered before
    it (at best 0.97 / 0.96)."""
    assert "t64x128x64_c2x1_1wg_rm" in [config_name(c) for c in pick_configs(1024, 1024, 1024)]


def test_pick_configs_offers_224_wide_tiles_where_n_is_14336():
    """14336 / 224 = 64 N tiles fill waves that 128- and 256-wide tiles leave part empty.
    H200 sweeps (bench sweep, nt / nn, of cuBLAS): 64x224 c2x1 at 128x14336x4096 0.99 /
    0.95 (the best offered then 0.97 / 0.99), 128x224 c2x1 at 256x14336x4096 0.95 / 1.02
    (0.92 / 1.01) and at 1024x14336x4096 0.96 / 1.00 (0.92 / 1.00)."""
    assert "t64x224x64_c2x1_1wg_rn" in [config_name(c) for c in pick_configs(128, 14336, 4096)]
    for m in (256, 1024):
        assert "t128x224x64_c2x1_coop_rm" in [config_name(c)
                                              for c in pick_configs(m, 14336, 4096)], m
    assert config_error(tile_n=224, tile_m=128) is None
    assert "not in" in config_error(tile_n=160, tile_m=128)


def test_pick_configs_offers_256x192_tiles_first_at_large_m_and_wide_n():
    """H200 sweep (bench sweep --rounds 5, nt / nn, against the best offered before):
    256x192 cooperative tiles (192 accumulator registers per thread) at 8192x128256x4096
    1.03 / 1.03, 8192x14336x4096 1.03 / 1.01; at N = 4096 (22 N tiles of 192) 0.96-0.98,
    where they must not lead."""
    for shape in [(8192, 128256, 4096), (8192, 14336, 4096), (1024, 128256, 4096)]:
        assert config_name(pick_configs(*shape)[0]) == "t256x192x64_c1x2_coop_rn", shape
    for shape in [(4096, 4096, 4096), (8192, 4096, 4096), (8192, 4096, 14336)]:
        assert not config_name(pick_configs(*shape)[0]).startswith("t256x192"), shape
    assert config_error(tile_m=256, tile_n=192) is None
    assert "192 accumulator" in config_error(tile_m=256, tile_n=224)


def test_pick_configs_splits_k_only_when_tiles_are_few():
    for m in (1, 16, 64, 128, 256):
        for n, k in ((4096, 4096), (4096, 14336)):
            best = pick_configs(m, n, k)[0]
            assert best.split_k > 1, (m, n, k, best)
    for shape in [(4096, 4096, 4096), (8192, 14336, 4096), (256, 14336, 4096),
                  (1, 1, 1), (64, 4096, 64)]:
        assert all(c.split_k == 1 for c in pick_configs(*shape)), shape
    for c in pick_configs(100, 201, 4096):  # odd N: split-K with the direct store
        assert config_error(**_fields(c)) is None
        assert c.store == "direct"
    assert any(c.split_k > 1 for c in pick_configs(100, 201, 4096))


def test_pick_configs_offers_pingpong_for_large_problems():
    for shape in [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 14336, 4096),
                  (1024, 14336, 4096)]:
        cfgs = pick_configs(*shape, max_configs=8)
        assert 2 <= sum(bool(c.pingpong) for c in cfgs) <= 4, shape
        assert any(c.cooperative for c in cfgs), shape
    # One tile per CTA: a ping-pong CTA would leave a warpgroup idle.
    assert not pick_configs(512, 512, 512)[0].pingpong
    assert not pick_configs(128, 8192, 8192)[0].pingpong


@pytest.mark.parametrize("name,store", [("coop_128x256_c2x1", "tma"), ("1wg_128x64", "direct"),
                                        ("pp_64x256", "tma"), ("pp_128x128_c2x1", "direct"),
                                        ("splitk2_64x128", "direct")])
def test_coordinate_epilogue_compiles(name, store):
    """The GPU coordinate test's fused epilogue (per-sub-tile hook with coordinates, rows
    and columns, the default bias path underneath) traces and compiles: a subclass's
    ``epilogue_op`` with extra epilogue arguments, on each kind of kernel."""
    from tests.gpu.test_gemm import COORDINATE_CONFIGS, compile_coordinate_gemm

    cfg = dict(COORDINATE_CONFIGS[name], store=store)
    assert callable(compile_coordinate_gemm(tuple(sorted(cfg.items()))))


@pytest.mark.parametrize("cfg,c_dtype", [
    (dict(tile_m=128, tile_n=256, cooperative=True), "bf16"),
    (dict(tile_m=128, tile_n=128, cooperative=False, pingpong=True), "bf16"),
    (dict(tile_m=64, tile_n=192, cooperative=False), "fp32"),
], ids=["coop_128x256_bf16", "pp_128x128_bf16", "1wg_64x192_fp32"])
def test_subtile_coordinates_match_the_smem_store(cfg, c_dtype):
    """Static layout check (no GPU): for every consumer thread and epilogue sub-tile s,
    the coordinates the hook gets for ``frag[v]`` (the accumulator's coordinate tensor
    retiled like the accumulator, sub-tile s) are where the register -> smem copy puts
    value v: its source-side position in the epilogue tile plus the tile's origin,
    which the TMA store writes to.  Together the sub-tiles cover the tile once."""
    import cutlass.utils.hopper_helpers as sm90_utils
    from cutlass.tensor_utils import LayoutEnum

    from cutedsl_inductor.compile.dtypes import cutlass_dtype
    from cutedsl_inductor.kernels.gemm.config import gemm_dtype

    gemm = Sm90Gemm(**cfg)
    row = LayoutEnum.ROW_MAJOR
    result = {}

    @cute.jit
    def trace():
        gemm._setup(cutlass.BFloat16, cutlass.BFloat16, cutlass_dtype(gemm_dtype(c_dtype)), row, row, row)
        tm, tn = gemm.tile_m, gemm.tile_n
        epi_m, epi_n = gemm.epi_tile
        subs_n = tn // epi_n
        stm_atom = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(False, 4),
                                       gemm.c_dtype)
        r2s = cute.make_tiled_copy_S(
            sm90_utils.get_smem_store_op(row, gemm.c_dtype, gemm.acc_dtype),
            cute.make_tiled_copy_C_atom(stm_atom, gemm.tiled_mma))
        tile_ident = cute.make_identity_tensor((tm, tn))
        epi_ident = cute.make_identity_tensor((epi_m, epi_n))
        got, want = [], []
        for t in cutlass.range_constexpr(gemm.tile_threads):
            tRS_coords = r2s.retile(gemm.tiled_mma.get_slice(t).partition_C(tile_ident))
            in_epi = r2s.get_slice(t).partition_S(epi_ident)
            sub_shape = cute.shape(in_epi)
            for s in cutlass.range_constexpr((tm // epi_m) * subs_n):
                sub_coords = Sm90Gemm._epi_slice(tRS_coords, s, sub_shape)
                for v in cutlass.range_constexpr(cute.size(sub_shape)):
                    got.append((int(sub_coords[v][0]), int(sub_coords[v][1])))
                    want.append(((s // subs_n) * epi_m + int(in_epi[v][0]),
                                 (s % subs_n) * epi_n + int(in_epi[v][1])))
        result.update(got=got, want=want, size=tm * tn)

    trace()
    assert result["got"] == result["want"]
    assert len(set(result["got"])) == len(result["got"]) == result["size"]
    # values 2j and 2j + 1 of a sub-tile are a column pair (m, n), (m, n + 1), n even:
    # the fused epilogue reads its inputs for both with one vector load
    got = result["got"]
    assert all(second == (first[0], first[1] + 1) and first[1] % 2 == 0
               for first, second in zip(got[::2], got[1::2]))


# -- swap-AB: small tile_n, column-major C (the caller passes C^T = B A^T) ---------------

SWAP_AB_CASES = [  # (config, A major, B major, bias dtype)
    (dict(tile_m=64, tile_n=16, tile_k=64, cooperative=False, raster="m", stages=16),
     "k", "k", None),
    (dict(tile_m=128, tile_n=16, tile_k=64, cluster_m=2, cooperative=True, raster="m",
          split_k=2), "m", "k", "bf16"),
    (dict(tile_m=256, tile_n=32, tile_k=64, cooperative=True, raster="m"), "k", "n", "bf16"),
    (dict(tile_m=128, tile_n=64, tile_k=64, cooperative=False, raster="m"), "m", "n", None),
]


@pytest.mark.parametrize("cfg,a_major,b_major,bias", SWAP_AB_CASES,
                         ids=[config_name(c[0]) + f"_A{c[1]}_B{c[2]}" for c in SWAP_AB_CASES])
def test_small_tiles_compile_with_a_column_major_output(cfg, a_major, b_major, bias):
    cfg = _with(cfg, store="direct")
    assert callable(compile_sm90_gemm(cfg, "bf16", "bf16", a_major, b_major, bias_dtype=bias,
                                      c_major="m"))


def test_small_tile_n_needs_the_direct_store_and_sets_the_epilogue_unit():
    assert "store='direct'" in config_error(tile_m=64, tile_n=16, cooperative=False)
    assert config_error(tile_m=64, tile_n=16, cooperative=False, store="direct") is None
    assert Sm90Gemm(tile_m=64, tile_n=16, cooperative=False, store="direct").epi_unit == 8
    assert Sm90Gemm(tile_m=128, tile_n=16, cooperative=True, store="direct").epi_unit == 8
    assert Sm90Gemm(tile_m=128, tile_n=32, cooperative=False, store="direct").epi_unit == 16
    assert Sm90Gemm(tile_m=128, tile_n=128).epi_unit == 16


def test_pick_configs_offers_swap_ab_only_for_small_m():
    for m, tile_n in ((1, 16), (16, 16), (17, 32), (32, 32)):
        swapped = [c for c in pick_configs(m, 14336, 4096, max_configs=100) if c.swap_ab]
        assert swapped, m
        assert all(c.tile_n == tile_n and c.store == "direct" for c in swapped), m
        assert all(config_error(**_fields(c)) is None for c in swapped)
    for m in (33, 64, 128, 4096):
        assert not any(c.swap_ab for c in pick_configs(m, 14336, 4096, max_configs=100))


def test_swap_ab_config_name():
    cfg = dict(tile_m=64, tile_n=16, tile_k=64, cooperative=False, raster="m", swap_ab=True,
               store="direct", split_k=2)
    assert config_name(cfg) == "t64x16x64_c1x1_1wg_rm_k2_swap"



class SwigluGemm(Sm90Gemm):
    """The two-weight kernel's entry as the template calls it: ``launch`` with the up
    weight as A's or B's partner."""

    @cute.jit
    def __call__(self, mA, mB, m_up, mC, stream):
        self.launch(mA, mB, mC, None, cutlass.Float32(1.0), cutlass.Float32(0.0), stream,
                    mA_up=m_up if self.swiglu == "a" else None,
                    mB_up=m_up if self.swiglu == "b" else None)


def compile_swiglu(cfg, ab="bf16", a_major="k", b_major="k", kernel=None):
    """The two-weight kernel of ``cfg`` (or ``kernel``) compiled on fake tensors."""
    from cutlass.runtime import make_fake_stream

    from cutedsl_inductor.kernels.gemm.standalone import make_fake_gemm_args

    store = cfg.get("store", "tma")
    c_major = "m" if cfg["swiglu"] == "a" else "n"  # swap-AB writes C^T
    args = [make_fake_gemm_args(ab, ab, a_major, b_major, store=store, c_major=c_major)
            for _ in range(2)]
    (a, b, c, _), up = args[0], args[1][0 if cfg["swiglu"] == "a" else 1]
    return cute.compile(kernel or SwigluGemm(**cfg), a, b, up, c,
                        make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")


SWIGLU_CASES = [  # every kind of consumer warpgroups, both majors, direct store, fp16
    (dict(tile_m=128, tile_n=128, cluster_m=2, cooperative=True, swiglu="b"), "bf16", "k"),
    (dict(tile_m=256, tile_n=64, cluster_n=2, cooperative=True, raster="n", swiglu="b"),
     "bf16", "n"),
    # two accumulators of 96 columns: those of a 256x192 GEMM tile
    (dict(tile_m=256, tile_n=96, cluster_n=2, cooperative=True, raster="n", swiglu="b"),
     "bf16", "k"),
    (dict(tile_m=128, tile_n=64, cooperative=False, pingpong=True, swiglu="b"), "fp16", "k"),
    (dict(tile_m=64, tile_n=128, cooperative=False, swiglu="b", store="direct"), "bf16", "n"),
    # swap-AB: the weights are A (multicast across a cluster along N: none here)
    (dict(tile_m=64, tile_n=16, cluster_m=2, cooperative=False, swiglu="a", store="direct"),
     "bf16", "k"),
    (dict(tile_m=128, tile_n=32, cooperative=True, swiglu="a", store="direct"), "fp16", "n"),
]


@pytest.mark.parametrize("cfg,ab,b_major", SWIGLU_CASES,
                         ids=[config_name(c[0]) + f"_{c[0]['swiglu']}_{c[1]}_B{c[2]}"
                              for c in SWIGLU_CASES])
def test_swiglu_variants_compile(cfg, ab, b_major):
    assert callable(compile_swiglu(cfg, ab, "k", b_major))


@pytest.mark.parametrize("cfg,b_major,wide", [
    (dict(tile_m=128, tile_n=128, cluster_m=2, cooperative=True, swiglu="b"), "k", True),
    (dict(tile_m=256, tile_n=64, cluster_n=2, cooperative=True, swiglu="b"), "k", True),
    (dict(tile_m=256, tile_n=96, cluster_n=2, cooperative=True, swiglu="b"), "k", True),
    (dict(tile_m=64, tile_n=128, cooperative=False, swiglu="b"), "n", True),
    # N-major 96-wide tiles: 192-byte rows, not whole 128-byte swizzle atoms
    (dict(tile_m=256, tile_n=96, cluster_n=2, cooperative=True, swiglu="b"), "n", False),
    # a K-major swizzle atom spans 64 of the 128 K: two slots are not one wider tile
    (dict(tile_m=128, tile_n=128, tile_k=128, cooperative=True, swiglu="b"), "k", False),
    # N-major 32-wide tiles: 64-byte swizzle, the joined tile would take the 128-byte one
    (dict(tile_m=64, tile_n=32, cooperative=False, swiglu="b", store="direct"), "n", False),
    (dict(tile_m=64, tile_n=16, cooperative=False, swiglu="a", store="direct"), "k", False),
])
def test_swiglu_weight_tiles_join_into_one_wgmma_where_their_smem_layouts_do(cfg, b_major,
                                                                             wide):
    kernel = SwigluGemm(**cfg)
    assert callable(compile_swiglu(cfg, "bf16", "k", b_major, kernel=kernel))
    assert kernel.wide_up is wide


def test_swiglu_config_errors_and_configs():
    assert "split_k" in config_error(tile_m=64, tile_n=64, cooperative=False,
                                              split_k=2, swiglu="b")
    assert "two accumulators" in config_error(tile_m=128, tile_n=256, swiglu="b")
    assert "must be" in config_error(swiglu="c")
    assert config_error(tile_m=128, tile_n=128, swiglu="b") is None
    from cutedsl_inductor.kernels.gemm.heuristic import swiglu_configs

    for m, n in ((128, 14336), (8192, 4096)):
        configs = swiglu_configs(m, n, 4096)
        assert 1 <= len(configs) <= 8
        assert all(c.swiglu == "b" and config_error(**_fields(c)) is None
                   for c in configs)
        assert all(config_name(c).endswith("_swiglu") for c in configs)
    # a large problem's best guess is the 128x256 cooperative tile's work: 128x128 per weight
    assert (configs[0].tile_m, configs[0].tile_n) == (128, 128)
    # at the LM head that of the 256x192 one: two accumulators of 96 columns
    assert config_name(swiglu_configs(8192, 128256, 4096)[0]) == "t256x96x64_c1x2_coop_rn_swiglu"


def test_swiglu_configs_swap_ab_first_for_small_m():
    from cutedsl_inductor.kernels.gemm.heuristic import swiglu_configs

    for m in (1, 16, 32):
        configs = swiglu_configs(m, 14336, 4096)
        swapped = [c for c in configs if c.swap_ab]
        assert swapped and configs[:len(swapped)] == swapped
        assert all(c.swiglu == "a" and c.store == "direct" for c in swapped)
        assert all(config_error(**_fields(c)) is None for c in configs)
        # two 256-row weight tiles per stage leave room for 2 stages: not offered
        assert not any(c.tile_m == 256 for c in swapped)
    assert not any(c.swap_ab for c in swiglu_configs(33, 14336, 4096))


def test_swiglu_needs_its_second_weight():
    from cutlass.runtime import make_fake_stream

    from cutedsl_inductor.kernels.gemm.standalone import make_fake_gemm_args

    a, b, c, _ = make_fake_gemm_args()
    with pytest.raises(ValueError, match="second weight"):
        cute.compile(Sm90Gemm(swiglu="b"), a, b, c, None, cutlass.Float32(1.0),
                     cutlass.Float32(0.0), make_fake_stream(use_tvm_ffi_env_stream=True),
                     options="--enable-tvm-ffi")


@pytest.mark.parametrize("name", list(TILE_INPUT_CONFIGS))
def test_a_tile_input_compiles_and_is_loaded_by_tma(name, tmp_path):
    """C = A @ B^T + R with R loaded by TMA into the store buffers (``mTile``): ldmatrix
    reads it, no global load of the epilogue reads it (one 64x64 tile: 2 sub-tiles, fewer
    than the 3 loaded ahead)."""
    from tests.helpers import compile_residual_gemm

    fn = compile_residual_gemm(TILE_INPUT_CONFIGS[name], dump_dir=str(tmp_path))
    assert callable(fn)
    ptx = next(tmp_path.glob("*.ptx")).read_text()
    assert "ldmatrix.sync.aligned" in ptx and "ld.global" not in ptx


def test_a_tile_input_needs_a_16_bit_c():
    from cutlass.cute.runtime import make_fake_tensor
    from cutlass.runtime import make_fake_stream

    from cutedsl_inductor.kernels.gemm.standalone import make_fake_gemm_args

    class Fp32Residual(Sm90Gemm):
        @cute.jit
        def __call__(self, mA, mB, mC, mR, stream):
            self.launch(mA, mB, mC, None, 1, 0, stream, mTile=mR)

    a, b, c, _ = make_fake_gemm_args("bf16", "fp32", "k", "k")
    residual = make_fake_tensor(cutlass.Float32, c.shape, c.stride, assumed_align=16)
    with pytest.raises(ValueError, match="tile input needs"):
        cute.compile(Fp32Residual(**TILE_INPUT_CONFIGS["coop_128x256_c2x1"]), a, b, c,
                     residual, make_fake_stream(use_tvm_ffi_env_stream=True))


def _fields(cfg):
    import dataclasses

    return dataclasses.asdict(cfg) if isinstance(cfg, GemmConfig) else cfg
