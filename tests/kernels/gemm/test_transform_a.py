"""The transform_a variant compiles GPU-less (fp32 and bf16 A, K- and M-major, the
kinds of consumer warpgroups), its WGMMAs read A from registers, and its config rules."""

import cutlass
import cutlass.cute as cute
import pytest
from cutlass.cute.runtime import make_fake_tensor
from cutlass.runtime import make_fake_stream

from cutedsl_inductor.kernels.gemm.config import GemmConfig, config_error
from cutedsl_inductor.kernels.gemm.sm90_gemm import Sm90Gemm


class WeightedA(Sm90Gemm):
    """A * w[k] (RMSNorm's weight) in the load path."""

    @cute.jit
    def __call__(self, mA, mB, mC, mW, stream):
        self.launch(mA, mB, mC, None, 1, 0, stream, pro_args=(mW,))

    @cute.jit
    def prologue_op(self, value, m, k, l_idx, pro_args):
        return value * pro_args[0][k].to(cutlass.Float32)


def compile_weighted(cfg, a_dtype, a_major, dump_dir=None):
    unit = 16 // (a_dtype.width // 8)
    m, k, n, l = cute.sym_int32(), cute.sym_int32(), cute.sym_int32(divisibility=8), cute.sym_int32()
    lda, bsa = cute.sym_int64(divisibility=unit), cute.sym_int64(divisibility=unit)
    a = make_fake_tensor(a_dtype, (m, k, l), (lda, 1, bsa) if a_major == "k" else (1, lda, bsa),
                         assumed_align=16)
    b = make_fake_tensor(cutlass.BFloat16, (n, k, l),
                         (cute.sym_int64(divisibility=8), 1, cute.sym_int64(divisibility=8)),
                         assumed_align=16)
    c = make_fake_tensor(cutlass.BFloat16, (m, n, l),
                         (cute.sym_int64(divisibility=8), 1, cute.sym_int64(divisibility=8)),
                         assumed_align=16)
    w = make_fake_tensor(cutlass.BFloat16, (cute.sym_int32(),), (1,))
    options = "--enable-tvm-ffi" + (f" --keep-ptx --dump-dir={dump_dir}" if dump_dir else "")
    return cute.compile(WeightedA(cfg), a, b, c, w, make_fake_stream(use_tvm_ffi_env_stream=True),
                        options=options)


@pytest.mark.parametrize("cfg, a_dtype, a_major", [
    (GemmConfig(transform_a=True), cutlass.Float32, "k"),
    (GemmConfig(tile_m=128, tile_n=128, cooperative=False, pingpong=True, transform_a=True),
     cutlass.BFloat16, "k"),
    (GemmConfig(tile_m=64, tile_n=128, cooperative=False, cluster_m=2, transform_a=True),
     cutlass.Float32, "m"),
])
def test_transformed_a_compiles(cfg, a_dtype, a_major):
    compile_weighted(cfg, a_dtype, a_major)


def test_wgmma_reads_a_from_registers(tmp_path):
    compile_weighted(GemmConfig(transform_a=True), cutlass.Float32, "k", dump_dir=tmp_path)
    (ptx,) = tmp_path.glob("*.ptx")
    wgmmas = [line for line in ptx.read_text().splitlines() if "wgmma.mma_async" in line]
    # per k-block: 4 of a 64-deep K tile, A as four 32-bit registers, B a descriptor
    assert len(wgmmas) == 4 and all("}, {%r" in line for line in wgmmas)


@pytest.mark.parametrize("fields", [
    dict(swiglu="b"), dict(swap_ab=True, store="direct"), dict(split_k=2, tile_m=128,
                                                               tile_n=128)])
def test_transform_a_takes_no_swiglu_swap_or_split(fields):
    assert "transform_a=True needs" in config_error(transform_a=True, **fields)
    assert GemmConfig(transform_a=True).name.endswith("_ta")
