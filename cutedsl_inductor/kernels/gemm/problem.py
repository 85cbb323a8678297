"""Whether a GEMM problem suits ``Sm90Gemm``: ``why_not`` (the reason, or None) and
``can_implement``.

The kernel's contract: A and B both bf16 or both fp16, or both FP8 (e4m3 or e5m2, each
K-major: FP8 WGMMA reads no other layout from shared memory), C bf16, fp16 or fp32 (fp32
accumulation); every non-unit stride of A, B and C (leading dimension and batch stride)
a multiple of 16 bytes and the base pointers 16-byte aligned (TMA's rules; for L == 1
the batch stride is unused but still declared divisible); M, N, K >= 1 and below 2^31,
tails handled; with ``store="tma"`` also ``N * sizeof(C) % 16 == 0`` (the TMA store
clips the N tail only to 16 bytes, so it would write past column N). C may also be float8
where it is a fused epilogue's output (``fused_output_error``), never a choice's own.
``standalone.make_fake_gemm_args`` declares exactly these contracts.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from ...template.template import default_fused_output_error
from .config import FP8_DTYPES, GemmConfig, config_error, gemm_dtype

__all__ = ["why_not", "can_implement", "fused_output_error"]

_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def why_not(
    a_dtype: Any, b_dtype: Any, out_dtype: Any, a_major: str, b_major: str,
    m: int, n: int, k: int, l: int = 1, bias_dtype: Any = None,
    lda: Optional[int] = None, ldb: Optional[int] = None,
    ldc: Optional[int] = None, batch_strides: Optional[tuple] = None,
    config: Any = None,
) -> Optional[str]:
    """Return why a problem cannot run on the kernel (with ``config``, if given), or None.

    ``a_major`` is "k" (row-major A) or "m"; ``b_major`` is "k" or "n" (``sm90_gemm``'s
    convention). ``lda/ldb/ldc`` are the non-unit leading strides in elements (default:
    the compact value), ``batch_strides`` the (A, B, C) batch strides in elements
    (default compact; ignored if l == 1). ``config``: a ``GemmConfig`` or its fields as
    a dict (then validated too).
    """
    ak, bk, ck = gemm_dtype(a_dtype), gemm_dtype(b_dtype), gemm_dtype(out_dtype)
    fp8 = ak in FP8_DTYPES and bk in FP8_DTYPES
    if not fp8 and (ak not in (torch.bfloat16, torch.float16) or ak != bk):
        return (f"A/B dtypes must both be bf16 or both fp16, or both FP8 (got {a_dtype}, "
                f"{b_dtype})")
    if ck not in _OUT_DTYPES:
        return f"output dtype {out_dtype} unsupported"
    if bias_dtype is not None and gemm_dtype(bias_dtype) not in _OUT_DTYPES:
        return f"bias dtype {bias_dtype} unsupported"
    if a_major not in ("k", "m"):
        return f"a_major must be 'k' or 'm', got {a_major!r}"
    if b_major not in ("k", "n"):
        return f"b_major must be 'k' or 'n', got {b_major!r}"
    if fp8 and (a_major, b_major) != ("k", "k"):
        return (f"FP8 WGMMA reads K-major operands only: A row-major (M x K) and B "
                f"column-major (K x N), got a_major={a_major!r}, b_major={b_major!r}")
    for name, v in (("m", m), ("n", n), ("k", k), ("l", l)):
        if int(v) < 1:
            return f"{name}={v} must be >= 1"
        if int(v) >= 2**31:
            return f"{name}={v} too large for int32 indexing"
    ab, bb, cb = ak.itemsize, bk.itemsize, ck.itemsize
    lda = lda if lda is not None else (k if a_major == "k" else m)
    ldb = ldb if ldb is not None else (k if b_major == "k" else n)
    ldc = ldc if ldc is not None else n
    for name, ld, eb in (("lda", lda, ab), ("ldb", ldb, bb), ("ldc", ldc, cb)):
        if (ld * eb) % 16:
            return f"{name}={ld} elements is not a multiple of 16 bytes (TMA)"
    if l > 1:
        bs = batch_strides or (m * k, n * k, m * n)
        for name, s, eb in zip(("A", "B", "C"), bs, (ab, bb, cb)):
            if (int(s) * eb) % 16:
                return f"batch stride of {name} ({s}) is not a multiple of 16 bytes"
    if isinstance(config, dict):
        err = config_error(**config)
        if err is not None:
            return err
        config = GemmConfig(**config)
    if config is not None and config.store == "tma" and (n * cb) % 16:
        return (f"n={n} is not a multiple of {16 // cb}: the TMA-store epilogue "
                "needs 16-byte rows; use store='direct'")
    return None


def can_implement(*args: Any, **kwargs: Any) -> bool:
    """``why_not(...) is None``; same arguments as :func:`why_not`."""
    return why_not(*args, **kwargs) is None


def fused_output_error(params: dict[str, Any], node: Any) -> str | None:
    """Why a choice of ``params`` cannot store a fused epilogue's output ``node``, or None:
    besides the default dtypes, float8 (e4m3, e5m2: the next layer's input, quantized with
    a scale the graph has), whose rows the TMA store writes in whole 16 bytes (N a
    multiple of 16; the direct store takes any N), and not from a ping-pong warpgroup
    holding 128 accumulator registers per thread: with rowwise scales, a bias and the
    quantization such a kernel spilled (docs/gemm.md), so its output stays bf16."""
    from torch._inductor.virtualized import V

    if node.get_dtype() not in FP8_DTYPES:
        return default_fused_output_error(params, node)
    if params.get("PINGPONG") and params["TILE_M"] * params["TILE_N"] >= 128 * 128:
        return "a float8 output of a ping-pong 128-register accumulator spills"
    n = node.get_size()[-1]
    if params["STORE"] == "tma" and not V.graph.sizevars.statically_known_multiple_of(n, 16):
        return f"a float8 output of N={n} columns, not known to be a multiple of 16 (TMA store)"
    return None
