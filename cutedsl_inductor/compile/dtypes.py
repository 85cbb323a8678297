"""torch dtypes as CuTe DSL types: the names generated code uses (``cutlass.BFloat16``)
and, for compiling, the types themselves (importing cutlass, so only where it compiles)."""

from __future__ import annotations

from typing import Any

import torch

_TORCH_TO_CUTLASS = {
    torch.float32: "Float32",
    torch.float16: "Float16",
    torch.bfloat16: "BFloat16",
    torch.float64: "Float64",
    torch.float8_e4m3fn: "Float8E4M3FN",
    torch.float8_e5m2: "Float8E5M2",
    torch.int8: "Int8",
    torch.uint8: "Uint8",
    torch.int16: "Int16",
    torch.int32: "Int32",
    torch.int64: "Int64",
    torch.bool: "Boolean",
}


def cutlass_dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"cutlass.BFloat16"``."""
    try:
        return f"cutlass.{_TORCH_TO_CUTLASS[dtype]}"
    except KeyError:
        raise TypeError(f"no CuTe DSL type for {dtype}") from None


def cutlass_dtype(dtype: torch.dtype) -> Any:
    import cutlass

    return getattr(cutlass, cutlass_dtype_name(dtype).removeprefix("cutlass."))
