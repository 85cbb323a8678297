"""``GemmProblem``: one GEMM as ``Sm90Gemm`` sees it, and whether it suits the kernel
(``why_not``: the reason, or None).

The kernel's contract: A and B both bf16 or both fp16, or both FP8 (e4m3 or e5m2, each
K-major: FP8 WGMMA reads no other layout from shared memory), C bf16, fp16 or fp32 (fp32
accumulation); every non-unit stride of A, B and C (leading dimension and batch stride)
a multiple of 16 bytes and the base pointers 16-byte aligned (TMA's rules; for L == 1
the batch stride is unused but still declared divisible); M, N, K >= 1 and below 2^31,
tails handled; with ``store="tma"`` also ``N * sizeof(C) % 16 == 0`` (the TMA store
clips the N tail only to 16 bytes, so it would write past column N). C may also be float8
where it is a fused epilogue's output (``fused_output_error``), never a choice's own.
``standalone.make_fake_gemm_args`` declares exactly these contracts.

A problem is frozen and well formed by construction (majors the kernel names, integer
sizes and strides, three batch strides): ``RecordError`` naming the field otherwise. A
well-formed problem the kernel cannot run is ``why_not``'s to say.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ...compile.records import Params
from ...exc import RecordError
from ...template.template import default_fused_output_error
from .config import FP8_DTYPES, GemmConfig, gemm_dtype

__all__ = ["GemmProblem", "fused_output_error"]

_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_MAJORS = {"a_major": ("k", "m"), "b_major": ("k", "n")}


def _refuse(field: str, value: Any, reason: str) -> RecordError:
    return RecordError(record="GemmProblem", field=field, value=value, reason=reason)


@dataclasses.dataclass(frozen=True)
class GemmProblem:
    """C (M x N, batch L) = A (M x K) @ B (K x N), in ``sm90_gemm``'s convention.

    ``a_major`` is "k" (row-major A) or "m"; ``b_major`` is "k" or "n". Dtypes are torch
    dtypes, CuTe DSL types or short names (``gemm_dtype``). ``lda/ldb/ldc`` are the
    non-unit leading strides in elements (None: the compact value), ``batch_strides``
    the (A, B, C) batch strides in elements (None: compact; unused where l == 1).
    """

    a_dtype: Any
    b_dtype: Any
    out_dtype: Any
    a_major: str
    b_major: str
    m: int
    n: int
    k: int
    l: int = 1
    bias_dtype: Any = None
    lda: int | None = None
    ldb: int | None = None
    ldc: int | None = None
    batch_strides: tuple[int, int, int] | None = None

    def __post_init__(self) -> None:
        for field, accepted in _MAJORS.items():
            if getattr(self, field) not in accepted:
                raise _refuse(field, getattr(self, field), f"expected one of {accepted}")
        for field in ("m", "n", "k", "l", "lda", "ldb", "ldc"):
            value = getattr(self, field)
            if not (value is None and field.startswith("ld") or _is_int(value)):
                raise _refuse(field, value, "expected an int (a size hint)")
        strides = self.batch_strides
        if strides is not None and not (isinstance(strides, tuple) and len(strides) == 3
                                        and all(map(_is_int, strides))):
            raise _refuse("batch_strides", strides, "expected None or three ints (A, B, C)")

    def replace(self, **changes: Any) -> "GemmProblem":
        return dataclasses.replace(self, **changes)

    def swapped(self) -> "GemmProblem":
        """The kernel's problem under swap-AB: C^T (N x M, column-major) = B A^T."""
        batch = self.batch_strides
        return self.replace(
            a_dtype=self.b_dtype, b_dtype=self.a_dtype, m=self.n, n=self.m,
            lda=self.ldb, ldb=self.lda,
            a_major={"k": "k", "n": "m"}[self.b_major],
            b_major={"k": "k", "m": "n"}[self.a_major],
            batch_strides=(batch[1], batch[0], batch[2]) if batch else None)

    def why_not(self, config: GemmConfig | None = None) -> str | None:
        """Why the kernel (with ``config``, where given) cannot run this problem, or
        None."""
        ak, bk, ck = (gemm_dtype(self.a_dtype), gemm_dtype(self.b_dtype),
                      gemm_dtype(self.out_dtype))
        fp8 = ak in FP8_DTYPES and bk in FP8_DTYPES
        if not fp8 and (ak not in (torch.bfloat16, torch.float16) or ak != bk):
            return (f"A/B dtypes must both be bf16 or both fp16, or both FP8 (got "
                    f"{self.a_dtype}, {self.b_dtype})")
        if ck not in _OUT_DTYPES:
            return f"output dtype {self.out_dtype} unsupported"
        if self.bias_dtype is not None and gemm_dtype(self.bias_dtype) not in _OUT_DTYPES:
            return f"bias dtype {self.bias_dtype} unsupported"
        if fp8 and (self.a_major, self.b_major) != ("k", "k"):
            return (f"FP8 WGMMA reads K-major operands only: A row-major (M x K) and B "
                    f"column-major (K x N), got a_major={self.a_major!r}, "
                    f"b_major={self.b_major!r}")
        return self._size_error() or self._stride_error(ak.itemsize, bk.itemsize,
                                                        ck.itemsize, config)

    def _size_error(self) -> str | None:
        for name in ("m", "n", "k", "l"):
            value = getattr(self, name)
            if value < 1:
                return f"{name}={value} must be >= 1"
            if value >= 2**31:
                return f"{name}={value} too large for int32 indexing"
        return None

    def _stride_error(self, ab: int, bb: int, cb: int, config: GemmConfig | None
                      ) -> str | None:
        m, n, k = self.m, self.n, self.k
        lda = self.lda if self.lda is not None else (k if self.a_major == "k" else m)
        ldb = self.ldb if self.ldb is not None else (k if self.b_major == "k" else n)
        ldc = self.ldc if self.ldc is not None else n
        for name, ld, eb in (("lda", lda, ab), ("ldb", ldb, bb), ("ldc", ldc, cb)):
            if (ld * eb) % 16:
                return f"{name}={ld} elements is not a multiple of 16 bytes (TMA)"
        if self.l > 1:
            for name, s, eb in zip(("A", "B", "C"),
                                   self.batch_strides or (m * k, n * k, m * n), (ab, bb, cb)):
                if (s * eb) % 16:
                    return f"batch stride of {name} ({s}) is not a multiple of 16 bytes"
        if config is not None and config.store == "tma" and (n * cb) % 16:
            return (f"n={n} is not a multiple of {16 // cb}: the TMA-store epilogue "
                    "needs 16-byte rows; use store='direct'")
        return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def fused_output_error(params: Params, node: Any) -> str | None:
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
