"""The GEMM compiled outside Inductor (tests, benchmarks, the GPU-less SASS checks):
fake tensors that declare the kernel's contracts, and ``compile_sm90_gemm``.

GPU-less: set ``CUTE_DSL_ARCH=sm_90a`` before importing cutlass.
"""

from __future__ import annotations

from typing import Any, Optional

import cutlass
import cutlass.cute as cute
import torch

from ...compile.dtypes import cutlass_dtype
from .config import GemmConfig, gemm_dtype
from .sm90_gemm import Sm90Gemm

__all__ = ["make_fake_gemm_args", "compile_sm90_gemm"]


def make_fake_gemm_args(ab_dtype: Any = "bf16", out_dtype: Any = "bf16", a_major: str = "k",
                        b_major: str = "k", bias_dtype: Any = None, store: str = "tma",
                        c_major: str = "n"):
    """Fake (A, B, C, Bias) tensors with symbolic M, N, K, L and symbolic strides.

    Non-unit strides are declared divisible by 16 bytes (the TMA contract); with
    ``store="tma"`` N is declared divisible by ``16 // sizeof(C)`` too (the compiled
    function then rejects other N at call time); ``c_major="m"`` makes C column-major
    (``store="direct"`` only); the bias (if ``bias_dtype``) gets fully symbolic strides
    (0 allowed) and shares the M/N/L symbols with C. Returns ``(A, B, C, Bias_or_None)``.
    """
    from cutlass.cute.runtime import make_fake_tensor

    ab, ck = gemm_dtype(ab_dtype), gemm_dtype(out_dtype)
    if ab not in (torch.bfloat16, torch.float16) or ck is None:
        raise ValueError(f"unsupported dtypes {ab_dtype}/{out_dtype}")
    ab_div, c_div = 16 // ab.itemsize, 16 // ck.itemsize
    m, k = cute.sym_int32(), cute.sym_int32()
    n = cute.sym_int32(divisibility=c_div if store == "tma" else 1)
    l = cute.sym_int32()
    lda, ldb = cute.sym_int64(divisibility=ab_div), cute.sym_int64(divisibility=ab_div)
    bsa, bsb = cute.sym_int64(divisibility=ab_div), cute.sym_int64(divisibility=ab_div)
    ldc, bsc = cute.sym_int64(divisibility=c_div), cute.sym_int64(divisibility=c_div)
    t_ab = cutlass_dtype(ab)
    a = make_fake_tensor(t_ab, (m, k, l), (lda, 1, bsa) if a_major == "k" else (1, lda, bsa),
                         assumed_align=16)
    b = make_fake_tensor(t_ab, (n, k, l), (ldb, 1, bsb) if b_major == "k" else (1, ldb, bsb),
                         assumed_align=16)
    c = make_fake_tensor(cutlass_dtype(ck), (m, n, l),
                         (ldc, 1, bsc) if c_major == "n" else (1, ldc, bsc), assumed_align=16)
    bias = None
    if bias_dtype is not None:
        bk = gemm_dtype(bias_dtype)
        if bk is None:
            raise ValueError(f"unsupported bias dtype {bias_dtype}")
        bias = make_fake_tensor(cutlass_dtype(bk), (m, n, l),
                                (cute.sym_int64(), cute.sym_int64(), cute.sym_int64()))
    return a, b, c, bias


def compile_sm90_gemm(config: Any, ab_dtype: Any = "bf16", out_dtype: Any = "bf16",
                      a_major: str = "k", b_major: str = "k", bias_dtype: Any = None,
                      kernel_cls: Optional[type] = None, c_major: str = "n",
                      max_active_clusters: Optional[int] = None):
    """Compile one GEMM variant (``config``: a ``GemmConfig``, or its fields as a dict,
    which may also name ``max_active_clusters``) with symbolic shapes and the TVM-FFI ABI.

    The result is called as ``f(A, B, C, Bias_or_None, alpha, beta)`` with torch CUDA
    tensors (views of the rank-3 layouts of ``sm90_gemm``) and Python floats; it runs on
    the current TVM-FFI environment stream (torch's current stream).
    """
    from cutlass.runtime import make_fake_stream

    if not isinstance(config, GemmConfig):
        fields = dict(config)
        max_active_clusters = fields.pop("max_active_clusters", max_active_clusters)
        config = GemmConfig(**fields)
    gemm = (kernel_cls or Sm90Gemm)(config, max_active_clusters=max_active_clusters)
    a, b, c, bias = make_fake_gemm_args(ab_dtype, out_dtype, a_major, b_major, bias_dtype,
                                        store=config.store, c_major=c_major)
    return cute.compile(gemm, a, b, c, bias, cutlass.Float32(1.0), cutlass.Float32(0.0),
                        make_fake_stream(use_tvm_ffi_env_stream=True),
                        options="--enable-tvm-ffi")
