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
from .config import FP8_DTYPES, GemmConfig, gemm_dtype
from .scaled import Sm90ScaledGemm
from .sm90_gemm import Sm90Gemm

_OPERAND_PAIRS = ([(torch.bfloat16,) * 2, (torch.float16,) * 2]
                  + [(a, b) for a in FP8_DTYPES for b in FP8_DTYPES])
_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32, *FP8_DTYPES)

__all__ = ["make_fake_gemm_args", "compile_sm90_gemm", "compile_scaled_gemm",
           "compile_scaled_swiglu", "SCALE_KINDS"]

# a scale's (M, N, L) strides: one value, one per row of C (A's rowwise scale), one per
# column (B's)
SCALE_KINDS = {"tensor": (0, 0, 0), "row": (1, 0, 0), "col": (0, 1, 0)}


def make_fake_gemm_args(ab_dtype: Any = "bf16", out_dtype: Any = "bf16", a_major: str = "k",
                        b_major: str = "k", bias_dtype: Any = None, store: str = "tma",
                        c_major: str = "n", b_dtype: Any = None):
    """Fake (A, B, C, Bias) tensors with symbolic M, N, K, L and symbolic strides.

    Non-unit strides are declared divisible by 16 bytes (the TMA contract); with
    ``store="tma"`` N is declared divisible by ``16 // sizeof(C)`` too (the compiled
    function then rejects other N at call time); ``c_major="m"`` makes C column-major
    (``store="direct"`` only); the bias (if ``bias_dtype``) gets fully symbolic strides
    (0 allowed) and shares the M/N/L symbols with C. ``b_dtype``: B's where it is not
    A's (FP8: e4m3 and e5m2 mix). Returns ``(A, B, C, Bias_or_None)``.
    """
    from cutlass.cute.runtime import make_fake_tensor

    ab, bk, ck = gemm_dtype(ab_dtype), gemm_dtype(b_dtype or ab_dtype), gemm_dtype(out_dtype)
    if (ab, bk) not in _OPERAND_PAIRS or ck not in _OUT_DTYPES:
        raise ValueError(f"unsupported dtypes {ab_dtype}/{b_dtype or ab_dtype}/{out_dtype}")
    ab_div, c_div = 16 // ab.itemsize, 16 // ck.itemsize
    m, k = cute.sym_int32(), cute.sym_int32()
    n = cute.sym_int32(divisibility=c_div if store == "tma" else 1)
    l = cute.sym_int32()
    lda, ldb = cute.sym_int64(divisibility=ab_div), cute.sym_int64(divisibility=ab_div)
    bsa, bsb = cute.sym_int64(divisibility=ab_div), cute.sym_int64(divisibility=ab_div)
    ldc, bsc = cute.sym_int64(divisibility=c_div), cute.sym_int64(divisibility=c_div)
    a = make_fake_tensor(cutlass_dtype(ab), (m, k, l),
                         (lda, 1, bsa) if a_major == "k" else (1, lda, bsa), assumed_align=16)
    b = make_fake_tensor(cutlass_dtype(bk), (n, k, l),
                         (ldb, 1, bsb) if b_major == "k" else (1, ldb, bsb), assumed_align=16)
    c = make_fake_tensor(cutlass_dtype(ck), (m, n, l),
                         (ldc, 1, bsc) if c_major == "n" else (1, ldc, bsc), assumed_align=16)
    bias = None
    if bias_dtype is not None:
        bias_kind = gemm_dtype(bias_dtype)
        if bias_kind not in _OUT_DTYPES[:3]:
            raise ValueError(f"unsupported bias dtype {bias_dtype}")
        bias = make_fake_tensor(cutlass_dtype(bias_kind), (m, n, l),
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

    config, max_active_clusters = _config(config, max_active_clusters)
    gemm = (kernel_cls or Sm90Gemm)(config, max_active_clusters=max_active_clusters)
    a, b, c, bias = make_fake_gemm_args(ab_dtype, out_dtype, a_major, b_major, bias_dtype,
                                        store=config.store, c_major=c_major)
    return cute.compile(gemm, a, b, c, bias, cutlass.Float32(1.0), cutlass.Float32(0.0),
                        make_fake_stream(use_tvm_ffi_env_stream=True),
                        options="--enable-tvm-ffi")


def compile_scaled_gemm(config: Any, a_dtype: Any = "e4m3", b_dtype: Any = "e4m3",
                        out_dtype: Any = "bf16", scale_a: str = "tensor",
                        scale_b: str = "tensor", bias_dtype: Any = None,
                        a_major: str = "k", b_major: str = "k",
                        max_active_clusters: Optional[int] = None, options: str = ""):
    """Compile ``Sm90ScaledGemm`` (``config`` as for :func:`compile_sm90_gemm`, ``fp8``
    set) with symbolic shapes and the TVM-FFI ABI, the scales of ``SCALE_KINDS``
    (``scale_a``, ``scale_b``) as fp32 (M, N, L) views with those static strides, the
    bias (``bias_dtype``) as a vector's ("col").

    Called as ``f(A, B, C, scale_a, scale_b, Bias_or_None)`` with torch CUDA tensors:
    the kernel's (M, K, L), (N, K, L), (M, N, L) views and, for the scales and the bias,
    views of those strides (``torch.as_strided``). ``options``: more ``cute.compile`` options
    (``--keep-cubin --dump-dir D``, for the resource counts)."""
    from cutlass.cute.runtime import make_fake_tensor
    from cutlass.runtime import make_fake_stream

    config, max_active_clusters = _config(config, max_active_clusters)
    gemm = Sm90ScaledGemm(config, max_active_clusters=max_active_clusters)
    a, b, c, _ = make_fake_gemm_args(a_dtype, out_dtype, a_major, b_major, store=config.store,
                                     b_dtype=b_dtype)
    scales = [make_fake_tensor(cutlass.Float32, c.shape, SCALE_KINDS[kind], assumed_align=16)
              for kind in (scale_a, scale_b)]
    bias = None
    if bias_dtype is not None:  # _scaled_mm's: a vector of N values
        bias = make_fake_tensor(cutlass_dtype(gemm_dtype(bias_dtype)), c.shape,
                                SCALE_KINDS["col"], assumed_align=16)
    return cute.compile(gemm, a, b, c, *scales, bias,
                        make_fake_stream(use_tvm_ffi_env_stream=True),
                        options=f"--enable-tvm-ffi {options}".strip())


class ScaledSwiglu(Sm90ScaledGemm):
    """The FP8 SwiGLU's entry, as the template calls ``launch``: three scales."""

    @cute.jit
    def __call__(self, mA, mB, m_up, mC, mScaleX, mScaleGate, mScaleUp, stream):
        self.launch(mA, mB, mC, None, 1, 1, stream,
                    epi_args=((mScaleX, mScaleGate, mScaleUp), None),
                    mA_up=m_up if self.swiglu == "a" else None,
                    mB_up=m_up if self.swiglu == "b" else None)


def compile_scaled_swiglu(config: Any, scale_x: str = "tensor", scale_w: str = "tensor",
                          out_dtype: Any = "bf16", options: str = ""):
    """Compile the FP8 SwiGLU (``Sm90ScaledGemm`` with ``config.swiglu`` "b", or "a": the
    weights as A, swap-AB) with symbolic shapes and the TVM-FFI ABI: e4m3 x and weights,
    K-major, the scales' kinds (``SCALE_KINDS``, in the kernel's (M, N): x's ``scale_x``,
    both weights' ``scale_w``) as fp32 views. Called as ``f(A, B, W_up, C, scale_x,
    scale_gate, scale_up)``: W_up laid out as the weight it pairs with (A with "a", B with
    "b"), C column-major with "a" (C^T, the direct store)."""
    from cutlass.cute.runtime import make_fake_tensor
    from cutlass.runtime import make_fake_stream

    config, max_active_clusters = _config(config, None)
    c_major = "m" if config.swiglu == "a" else "n"
    a, b, c, _ = make_fake_gemm_args("e4m3", out_dtype, store=config.store, c_major=c_major)
    weight = a if config.swiglu == "a" else b
    up = make_fake_tensor(weight.element_type, weight.shape, weight.stride, assumed_align=16)
    scales = [make_fake_tensor(cutlass.Float32, c.shape, SCALE_KINDS[kind], assumed_align=16)
              for kind in (scale_x, scale_w, scale_w)]
    return cute.compile(ScaledSwiglu(config, max_active_clusters=max_active_clusters),
                        a, b, up, c, *scales, make_fake_stream(use_tvm_ffi_env_stream=True),
                        options=f"--enable-tvm-ffi {options}".strip())


def _config(config: Any, max_active_clusters: Optional[int]) -> tuple[GemmConfig, Any]:
    """A ``GemmConfig`` (from one, or its fields as a dict that may also name
    ``max_active_clusters``) and the grid cap."""
    if isinstance(config, GemmConfig):
        return config, max_active_clusters
    fields = dict(config)
    max_active_clusters = fields.pop("max_active_clusters", max_active_clusters)
    return GemmConfig(**fields), max_active_clusters
