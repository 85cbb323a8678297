"""``bench model --profile``: kernels sorted into categories by name, and a step's GPU
time summed by category (no GPU needed: names of real kernels, one compiled here)."""

import re
from pathlib import Path

import pytest

from cutedsl_inductor.bench.model import jobs_of, settle
from cutedsl_inductor.bench.kernel_profile import KernelTime
from cutedsl_inductor.bench.model_profile import CATEGORIES, category, gpu_breakdown
from cutedsl_inductor.cli import parser
from tests.compile.cache.test_disk_cache import add_choice


def test_a_kernel_cute_dsl_compiled_is_ours(graph, kernel_cache_dir):
    add_choice(graph).load()
    (obj,) = Path(kernel_cache_dir).glob("*/*.o")
    names = set(re.findall(rb"kernel_cutlass_\w+", obj.read_bytes()))
    assert names, "no CuTe DSL kernel name in the object"
    assert {category(name.decode()) for name in names} == {"cutedsl"}


@pytest.mark.parametrize("name,expected", [
    ("triton_tem_fused_mm_0", "triton_gemm"),
    ("triton_poi_fused_add_mul_silu_3", "triton"),
    ("triton_red_fused__to_copy_mean_pow_1", "triton"),
    ("nvjet_tst_128x256_64x4_2x1_v_bz_coopB_TNN", "aten_gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_"
     "execute_segment_k_off_kernel__5x_cublas", "aten_gemm"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16>(...)", "aten_gemm"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>(...)",
     "attention"),
    ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80(...)", "attention"),
    ("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl<...>>(...)",
     "other"),
])
def test_kernels_of_other_libraries_by_name(name, expected):
    assert category(name) == expected


def test_the_breakdown_is_per_step_and_idle_is_what_no_kernel_covers():
    kernels = [("kernel_cutlass_kernel_gemm", 300.0), ("triton_poi_fused_1", 50.0),
               ("kernel_cutlass_kernel_gemm", 300.0), ("triton_poi_fused_1", 50.0)]
    row, top = gpu_breakdown(kernels, steps=2, step_ms=0.5)
    assert row["gpu_cutedsl_ms"] == pytest.approx(0.3)
    assert row["gpu_triton_ms"] == pytest.approx(0.05)
    assert row["gpu_kernels_ms"] == pytest.approx(0.35)
    assert row["gpu_idle_ms"] == pytest.approx(0.15)
    assert row["gpu_launches"] == 2
    assert all(f"gpu_{c}_ms" in row for c in CATEGORIES)
    assert top[0] == KernelTime("kernel_cutlass_kernel_gemm", pytest.approx(0.3), 1.0)


def test_profile_units_reach_every_job():
    argv = ["bench", "model", "--families", "llama,gpt2", "--workloads", "decode,train",
            "--profile", "5"]
    plan = jobs_of(settle(parser(argv=argv).parse_args(argv)))
    assert [job.profile for job in plan] == [5, 5, 5, 5]
