"""The FP8 GEMM of ``torch._scaled_mm`` (``Sm90ScaledGemm``), compiled GPU-less for sm_90a:
every scale kind, output dtype and FP8 operand mix, the refusals of layouts FP8 WGMMA
cannot read, the FP8 configs, and the compiled kernels' PTX and resource usage."""

import os

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import re  # noqa: E402
import subprocess  # noqa: E402

import pytest  # noqa: E402

cutlass = pytest.importorskip("cutlass")
import torch  # noqa: E402

from cutedsl_inductor.kernels.gemm.config import GemmConfig, config_error  # noqa: E402
from cutedsl_inductor.kernels.gemm.heuristic import (  # noqa: E402
    fp8_configs,
    fp8_swiglu_configs,
    pick_configs,
    swiglu_configs,
)
from cutedsl_inductor.kernels.gemm.problem import GemmProblem  # noqa: E402
from cutedsl_inductor.kernels.gemm.standalone import (  # noqa: E402
    compile_scaled_gemm,
    compile_scaled_swiglu,
)
from tests.helpers import cuobjdump  # noqa: E402

COOP = GemmConfig(128, 256, 128, cluster_m=2, fp8=True)
PINGPONG = GemmConfig(128, 128, 128, cluster_n=2, pingpong=True, cooperative=False,
                      raster="n", fp8=True)
SWAP_SPLIT = GemmConfig(128, 16, 128, raster="m", store="direct", swap_ab=True, split_k=2,
                        fp8=True)


def _ptx_and_usage(tmp_path, cfg, *args, compile=compile_scaled_gemm, **kwargs):
    """The PTX of the kernel ``compile`` compiles and, where cuobjdump is installed, its
    resource usage line(s): (REG, STACK, LOCAL) per function."""
    compile(cfg, *args, **kwargs, options=f"--keep-ptx --keep-cubin --dump-dir {tmp_path}")
    (ptx,) = tmp_path.glob("*.ptx")
    tool = cuobjdump()
    usage = None
    if tool is not None:
        (cubin,) = tmp_path.glob("*.cubin")
        text = subprocess.run([tool, "--dump-resource-usage", str(cubin)], check=True,
                              capture_output=True, text=True).stdout
        usage = re.findall(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", text)
    return ptx.read_text(), usage


@pytest.mark.parametrize("cfg", [COOP, PINGPONG, SWAP_SPLIT], ids=lambda c: c.name)
@pytest.mark.parametrize("scales,out,bias", [
    (("tensor", "tensor"), "bf16", None),
    (("row", "col"), "bf16", "bf16"),
    (("tensor", "col"), "fp32", "fp32"),
], ids=["tensorwise-bf16", "rowwise-bf16-bias", "mixed-fp32-bias"])
def test_scale_kinds_and_outputs_compile(cfg, scales, out, bias):
    assert callable(compile_scaled_gemm(cfg, "e4m3", "e4m3", out, *scales, bias_dtype=bias))


@pytest.mark.parametrize("a_dtype,b_dtype", [("e4m3", "e5m2"), ("e5m2", "e4m3"),
                                             ("e5m2", "e5m2")])
def test_the_wgmma_takes_each_fp8_mix(tmp_path, a_dtype, b_dtype):
    ptx, _ = _ptx_and_usage(tmp_path, COOP, a_dtype, b_dtype, "bf16", "row", "col")
    assert set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n256k32\.f32\.(\w+)\.(\w+)",
                          ptx)) == {(a_dtype, b_dtype)}


@pytest.mark.parametrize("scales,loads", [
    (("tensor", "tensor"), {"b32": 2}),
    (("row", "col"), {"b32": 2, "v2.b32": 4}),
])
def test_scales_load_once_per_value_they_hold(tmp_path, scales, loads):
    """Loads per sub-tile (64 rows per warpgroup x 32 columns: a thread's 16 values in 2
    rows and 4 adjacent column pairs): a tensorwise scale one (the loads of one address
    are one), A's rowwise scale one per row, B's one per column pair, as the bias."""
    ptx, _ = _ptx_and_usage(tmp_path, COOP, "e4m3", "e4m3", "fp32", *scales,
                            bias_dtype="bf16")
    subtiles = (128 // 128) * (256 // 32)
    found = {kind: ptx.count(f"ld.global.{kind}")
             for kind in set(re.findall(r"ld\.global\.([\w.]+)", ptx))}
    assert found == {kind: count * subtiles for kind, count in {**loads, "v2.b16": 4}.items()}


@pytest.mark.parametrize("cfg", fp8_configs(8192, 8192, 8192)[:2], ids=lambda c: c.name)
def test_rowwise_scales_and_bias_fit_in_registers(tmp_path, cfg):
    """The heuristic's first FP8 configs with both rowwise scales and a bias: no stack
    frame, no local memory (the 256x192 tile, which spilled, is not offered)."""
    if cuobjdump() is None:
        pytest.skip("cuobjdump is not installed (pip install nvidia-cuda-cuobjdump)")
    _, usage = _ptx_and_usage(tmp_path, cfg, "e4m3", "e4m3", "bf16", "row", "col",
                              bias_dtype="bf16")
    assert [(stack, local) for _, stack, local in usage] == [("0", "0")], usage


@pytest.mark.parametrize("cfg,out", [*((c, "e4m3") for c in fp8_configs(8192, 8192, 8192)[:2]),
                                     (SWAP_SPLIT, "e5m2")], ids=lambda c: getattr(c, "name", c))
def test_a_float8_output_rounds_pairs_and_fits_in_registers(tmp_path, cfg, out):
    """A float8 C (a fused epilogue's: the next layer's quantized input): the TMA store
    converts each pair of values at once (saturating) and writes it to smem as two bytes,
    the direct store a value at a time; no stack frame, no local memory."""
    ptx, usage = _ptx_and_usage(tmp_path, cfg, "e4m3", "e4m3", out, "row", "col")
    values = cfg.tile_m * cfg.tile_n // (128 * cfg.tile_wgs)  # per thread, in the code
    per_op = 1 if cfg.store == "direct" else 2
    assert ptx.count(f"cvt.rn.satfinite.{out}x2.f32") == values // per_op
    stores = "st.global.b8" if cfg.store == "direct" else "st.shared.b16"
    assert ptx.count(stores) == values // per_op
    assert ".local" not in ptx
    if usage is not None:
        assert [(stack, local) for _, stack, local in usage] == [("0", "0")], usage


@pytest.mark.parametrize("a_major,b_major", [("m", "k"), ("k", "n")])
def test_operands_fp8_wgmma_cannot_read_are_refused(a_major, b_major):
    reason = GemmProblem("e4m3", "e4m3", "bf16", a_major, b_major, 256, 256, 256).why_not()
    assert reason.startswith("FP8 WGMMA reads K-major operands only")
    with pytest.raises(Exception, match="FP8 WGMMA reads K-major A and B only"):
        compile_scaled_gemm(COOP, a_major=a_major, b_major=b_major)


def test_fp8_operands_need_an_fp8_config_and_16_bit_ones_a_plain_one():
    with pytest.raises(Exception, match="operands with fp8=False"):
        compile_scaled_gemm(COOP.replace(fp8=False))
    with pytest.raises(Exception, match="operands with fp8=True"):
        compile_scaled_gemm(COOP, "bf16", "bf16")


def test_what_the_problem_check_takes():
    def why_not(*args, **kwargs):
        return GemmProblem(*args, **kwargs).why_not()

    assert why_not("e4m3", "e5m2", "fp32", "k", "k", 1, 4096, 4096, bias_dtype="bf16") is None
    assert "unsupported" in why_not("e4m3", "e4m3", "e4m3", "k", "k", 256, 256, 256)
    assert "bf16 or both fp16, or both FP8" in why_not("e4m3", "bf16", "bf16", "k", "k",
                                                       256, 256, 256)
    # _scaled_mm's K and N are multiples of 16: one-byte rows of 16 bytes; 8 is not
    assert "lda=8" in why_not("e4m3", "e4m3", "bf16", "k", "k", 256, 256, 8)


def test_the_fp8_config_counts_one_byte_operands():
    """A split-K tile whose 16-bit stages do not fit twice next to the reduction buffer
    fits with FP8 operands; FP8 takes no transformed A."""
    fields = dict(tile_m=128, tile_n=192, tile_k=128, split_k=2)
    assert "two pipeline stages" in config_error(**fields)
    assert GemmConfig(**fields, fp8=True).name == "t128x192x128_c1x1_coop_rm_k2_fp8"
    assert "fp8=True needs" in config_error(tile_m=128, tile_n=128, fp8=True, transform_a=True)


@pytest.mark.parametrize("m,n,k", [(8192, 8192, 8192), (16, 4096, 4096), (128, 14336, 4096),
                                   (4096, 128256, 4096)])
def test_fp8_configs_follow_the_16_bit_ranking_with_whole_128_byte_rows(m, n, k):
    configs = fp8_configs(m, n, k, max_configs=None)
    assert configs and all(c.fp8 and c.tile_k == 128 for c in configs)
    assert len(set(configs)) == len(configs)
    assert all(c.tile_m * c.tile_n <= 128 * 128 * c.tile_wgs for c in configs)
    ranked = [c.replace(tile_k=128, fp8=True) for c in pick_configs(m, n, k, max_configs=None)
              if c.tile_m * c.tile_n <= 128 * 128 * c.tile_wgs]
    assert configs == list(dict.fromkeys(ranked))
    assert any(c.swap_ab for c in configs) == (m <= 32)
    assert len(fp8_configs(m, n, k)) == min(8, len(configs))
    # rows of 4100 bf16 values are no whole 16 bytes (the TMA store's), of fp32 ones they are
    assert all(c.store == "direct" for c in fp8_configs(m, 4100, k, max_configs=None))
    assert any(c.store == "tma" for c in fp8_configs(m, 4100, k, max_configs=None,
                                                      out_dtype=torch.float32))


SWIGLU_SHAPES = [(8192, 14336, 4096), (16, 14336, 4096), (1000, 4096, 1024)]


def _register_kinds(configs):
    """One config per kind of register use: clusters, rasters and stages aside."""
    kinds = {}
    for cfg in configs:
        kinds.setdefault((cfg.tile_m, cfg.tile_n, cfg.cooperative, cfg.pingpong, cfg.swiglu,
                          cfg.store), cfg)
    return list(kinds.values())


SWIGLU_OFFERED = _register_kinds([c for shape in SWIGLU_SHAPES for c in fp8_swiglu_configs(*shape)])


@pytest.mark.parametrize("cfg", SWIGLU_OFFERED, ids=lambda c: c.name)
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_the_offered_fp8_swiglu_kernels_compile_without_spills(tmp_path, cfg, recipe):
    """Every kind of config ``fp8_swiglu_configs`` offers at a prefill, a decode and a
    mid-size shape, with x's and both weights' scales tensorwise or rowwise (in the
    kernel's (M, N): swap-AB's weights are its A): FP8 WGMMAs of e4m3, the two weight
    tiles one WGMMA twice as wide where they join, no stack frame, no local memory."""
    scales = {"tensorwise": ("tensor", "tensor"),
              "rowwise": ("col", "row") if cfg.swiglu == "a" else ("row", "col")}[recipe]
    ptx, usage = _ptx_and_usage(tmp_path, cfg, *scales, compile=compile_scaled_swiglu)
    widths = set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k32\.f32\.e4m3\.e4m3",
                            ptx))
    wide = cfg.swiglu == "b" and 2 * cfg.tile_n <= 256  # K tile of 128 bytes: one swizzle row
    assert widths == {str(cfg.tile_n * (2 if wide else 1))}
    assert ".local" not in ptx
    if usage is not None:
        assert [(stack, local) for _, stack, local in usage] == [("0", "0")], usage


@pytest.mark.parametrize("m,n,k", SWIGLU_SHAPES)
def test_fp8_swiglu_configs_follow_the_two_weight_ranking_in_128_byte_rows(m, n, k):
    configs = fp8_swiglu_configs(m, n, k, max_configs=None)
    assert configs and all(c.fp8 and c.swiglu and c.tile_k == 128 for c in configs)
    assert len(set(configs)) == len(configs)
    # two accumulators of at most 128 registers per thread together
    assert all(2 * c.tile_m * c.tile_n <= 128 * 128 * c.tile_wgs for c in configs)
    ranked = [c.replace(tile_k=128, fp8=True) for c in swiglu_configs(m, n, k, max_configs=None)
              if 2 * c.tile_m * c.tile_n <= 128 * 128 * c.tile_wgs]
    assert configs == list(dict.fromkeys(ranked))
    assert any(c.swiglu == "a" for c in configs) == (m <= 32)
    assert len(fp8_swiglu_configs(m, n, k)) == min(8, len(configs))
