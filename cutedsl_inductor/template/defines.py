"""``gen_defines``: template parameters as typed ``cutlass.Constexpr`` definitions.

Each parameter renders as ``NAME: cutlass.Constexpr = <literal>``. Accepted values:
int, float, bool, str and torch.dtype (rendered as the matching cutlass type, e.g.
``cutlass.BFloat16``). Anything else is a ``TypeError`` naming the parameter, so a
typo never turns into generated code that fails later in the CuTe compiler. Names are
pasted into the module, so each must be a Python identifier (not a keyword): anything
else is a ``ValueError`` (``check_names``), never code.
"""

from __future__ import annotations

import keyword
import math
from collections.abc import Mapping
from typing import Any

import torch

from ..compile.dtypes import cutlass_dtype_name


def define_literal(name: str, value: Any) -> str:
    """The Python literal for one parameter value (see module docstring)."""
    if isinstance(value, bool):
        return repr(value)
    if isinstance(value, int):
        return repr(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return f"float({str(value)!r})"
        return repr(value)
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, torch.dtype):
        return cutlass_dtype_name(value)
    raise TypeError(
        f"template parameter {name}={value!r} has type {type(value).__name__}; "
        "gen_defines accepts int, float, bool, str and torch.dtype"
    )


def check_names(params: Mapping[str, Any]) -> None:
    for name in params:
        if not (isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name)):
            raise ValueError(f"template parameter name {name!r} is not a Python identifier")


def gen_defines(params: Mapping[str, Any]) -> str:
    check_names(params)
    return "".join(
        f"{name}: cutlass.Constexpr = {define_literal(name, value)}\n"
        for name, value in params.items()
    )
