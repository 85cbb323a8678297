"""Prologue fusion on an sm_90 GPU: the transform_a kernel against a float64 reference
(cast, scale, RMSNorm-weight multiply, add; bf16 and fp16; shapes that are not tile
multiples), and a compiled mm whose fp32 -> bf16 cast runs inside our GEMM."""

import pytest
import torch

from cutedsl_inductor import config
from cutedsl_inductor.kernels.gemm.config import GemmConfig

pytestmark = pytest.mark.gpu

# the transforms, in torch on (x, w[k], y[m, k]); the kernel's are ``KERNELS``
TRANSFORMS = {
    "cast": lambda x, w, y: x,
    "scale": lambda x, w, y: x * 0.125,
    "rmsnorm_weight": lambda x, w, y: x * w,
    "add": lambda x, w, y: x + y,
}
CONFIGS = [GemmConfig(transform_a=True),
           GemmConfig(tile_m=128, tile_n=128, cooperative=False, pingpong=True, transform_a=True),
           GemmConfig(tile_m=64, tile_n=128, cooperative=False, cluster_m=2, transform_a=True)]


def transformed_gemm(cfg, name, dtype):
    """``Sm90Gemm`` with transform ``name`` as its ``prologue_op``, compiled (TVM-FFI) for an fp32
    A and B, C, w, y of ``dtype``: called as ``f(A, B, C, w, y, ld_y)``."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor
    from cutlass.runtime import make_fake_stream

    from cutedsl_inductor.compile.dtypes import cutlass_dtype

    gemm = kernel_class(name)(cfg)
    t = cutlass_dtype(dtype)
    m, k, l = cute.sym_int32(), cute.sym_int32(), cute.sym_int32()
    n = cute.sym_int32(divisibility=8)

    def matrix(dtype_, rows, unit):
        return make_fake_tensor(dtype_, (rows, k, l),
                                (cute.sym_int64(divisibility=unit), 1,
                                 cute.sym_int64(divisibility=unit)), assumed_align=16)

    a, b = matrix(cutlass.Float32, m, 4), matrix(t, n, 8)
    c = make_fake_tensor(t, (m, n, l), (cute.sym_int64(divisibility=8), 1,
                                        cute.sym_int64(divisibility=8)), assumed_align=16)
    w, y = (make_fake_tensor(t, (cute.sym_int32(),), (1,)) for _ in range(2))
    return cute.compile(gemm, a, b, c, w, y, cutlass.Int32(1),
                        make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")


def kernel_class(name):
    """The GEMM with transform ``name`` in its load path (w, y, y's row stride: pro_args)."""
    import cutlass
    import cutlass.cute as cute

    from cutedsl_inductor.kernels.gemm.sm90_gemm import Sm90Gemm

    class Transformed(Sm90Gemm):
        @cute.jit
        def __call__(self, mA, mB, mC, mW, mY, ld_y, stream):
            self.launch(mA, mB, mC, None, 1, 0, stream, pro_args=(mW, mY, ld_y))

        @cute.jit
        def prologue_op(self, value, m, k, l_idx, pro_args):
            result = value
            if cutlass.const_expr(name == "scale"):
                result = value * 0.125
            if cutlass.const_expr(name == "rmsnorm_weight"):
                result = value * pro_args[0][k].to(cutlass.Float32)
            if cutlass.const_expr(name == "add"):
                result = value + pro_args[1][m * pro_args[2] + k].to(cutlass.Float32)
            return result

    return Transformed


def mkl(t):
    """A row-major (rows, cols) matrix as the kernel's (rows, cols, 1)."""
    return t.unsqueeze(0).permute(1, 2, 0)


@pytest.mark.parametrize("name", sorted(TRANSFORMS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m, n, k", [(256, 384, 512), (1000, 264, 520), (77, 128, 72)])
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.name)
def test_transformed_a_matches_float64(name, dtype, m, n, k, cfg):
    reference = TRANSFORMS[name]
    x = torch.randn(m, k, device="cuda", dtype=torch.float32)
    w = torch.randn(k, device="cuda", dtype=dtype)
    y = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(n, k, device="cuda", dtype=dtype)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    transformed_gemm(cfg, name, dtype)(mkl(x), mkl(b), mkl(c), w, y.view(-1), k)
    torch.cuda.synchronize()
    a = reference(x.double(), w.double(), y.double()).to(dtype).double()  # B's dtype
    ref = a @ b.double().t()
    err = ((c.double() - ref).norm() / ref.norm()).item()
    assert err < 1e-2, err


def test_a_compiled_mm_with_an_fp32_cast_runs_our_fused_kernel():
    from torch._inductor.utils import run_and_get_code

    x = torch.randn(2048, 1024, device="cuda", dtype=torch.float32)
    w = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)

    def fn(x, w):
        return x.to(torch.bfloat16) @ w.t()

    torch._dynamo.reset()
    with torch._inductor.config.patch(max_autotune=True, max_autotune_gemm_backends="CUTEDSL",
                                      fx_graph_cache=False, shape_padding=False), \
            config.patch(prologue_fusion=True, gemm_max_configs=2), \
            torch.no_grad():
        result, codes = run_and_get_code(torch.compile(fn), x, w)
    code = "\n".join(codes)
    ref = x.double().to(torch.bfloat16).double() @ w.double().t()
    assert ((result.double() - ref).norm() / ref.norm()).item() < 1e-2
    if "transform_a=True" not in code:
        # the timing decided against the fusion: then the cast is a kernel of its own
        assert "triton_poi_fused" in code
        pytest.skip("the fused kernel lost its timing on this GPU (not taken, as designed)")
    assert "_prologue(value, c0, c1, extras)" in code
    assert "triton_poi_fused" not in code, "the cast stayed a separate kernel"
