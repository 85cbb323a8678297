"""Inductor pointwise IR -> CuTe DSL scalar code, the groundwork for epilogue fusion.

``PointwiseToCuteDSL`` is an Inductor ops handler. Installed with ``V.set_ops_handler``
while a pointwise body runs (``ir.Pointwise.inner_fn``, or a ``LoopBody``), every op
appends one line ``tmpN = <expr>`` to ``handler.lines`` and returns the name ``tmpN``.
The lines are straight-line Python for the body of a ``@cute.jit``/``@cute.kernel``
function: each value is ONE scalar (``cutlass.Float32``, ``cutlass.Boolean`` ...) of the
element being computed, so a template evaluates them element by element (e.g. over the
fragment of an accumulator).

Invariants:
  * Arithmetic runs in fp32. A 16-bit value is upcast when loaded. A cast to bf16/fp16
    means what it means in Inductor's Triton code: with ``use_compute_types`` (Inductor's
    default) it casts to the compute type, fp32, and does not round; with
    ``use_compute_types=False`` (what ``emulate_precision_casts`` emits) it rounds and
    keeps the 16-bit type, and a later op upcasts it again. A caller stores the result in
    its buffer's dtype. Every temp has a known dtype (float32, bfloat16, float16, int32
    or bool; int64 too in a subclass whose ``SUPPORTED`` has it), see ``dtype_of``;
    operands are promoted explicitly (float beats int beats bool), never left to CuTe's
    implicit rules.
  * Precision matches Inductor's Triton kernels: exp, log and division use the
    hardware approximations (``ex2``/``lg2``/``rcp.approx``, as ``tl.exp``, ``tl.log``
    and fp32 ``/`` do), erf CuTe's fast-math form; tanh, sqrt and rsqrt are exact-rounded
    library code. An epilogue runs while the tensor cores idle: its instructions count.
  * A handler whose ``STORE_ONLY`` names a dtype (the epilogue's: float8) takes a cast to
    it as the value the caller stores and rounds: the temp keeps its fp32 value, typed
    as that dtype, and any other use of it is refused (nothing here computes on float8).
  * Constants are typed (``cutlass.Float32(0.5)``, ``cutlass.Float32(float('inf'))``).
  * Identical expression text gives the same temp (CSE), so the lines are deterministic
    for a given body and ``load_value`` callback.
  * Buffers are read only through the caller's ``load_value(name, index)``: it returns
    the CuTe expression of that element (the accumulator, a per-row vector, a tensor),
    either as ``str`` (an fp32 value) or as ``(str, torch.dtype)``.

Failure semantics: anything that cannot be translated (an op not implemented here,
``index_expr``/``indirect_indexing``, an unsupported dtype, a store with a mode, a
non-pointwise node) raises ``NotImplementedError`` naming the op, at translation time.
Callers treat that as "this epilogue is not fusable"; nothing is emitted half-way that
another component must undo (a failed handler is simply dropped).
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Sequence, Union

import torch
from torch._inductor.ops_handler import DefaultHandler
from torch._inductor.virtualized import OpsValue, V

from ..compile.dtypes import cutlass_dtype_name

LoadValue = Callable[[str, Any], Union[str, tuple[str, torch.dtype]]]

_FLOAT16 = (torch.bfloat16, torch.float16)
_FLOATS = (torch.float32, *_FLOAT16)
# the dtypes a translated value may have (names from ``compile.dtypes.cutlass_dtype_name``)
_SUPPORTED = (torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.bool)
_INT32_RANGE = (-(2**31), 2**31 - 1)


class Translation(NamedTuple):
    lines: list[str]  # ``tmpN = <expr>`` lines, in order
    result: str  # the temp holding the body's value
    dtype: torch.dtype  # that value's CuTe type as a torch dtype


def _unsupported(op: str, why: str = "") -> NotImplementedError:
    return NotImplementedError(
        f"PointwiseToCuteDSL: op {op} is not supported{': ' + why if why else ''}"
    )


class PointwiseToCuteDSL(DefaultHandler):
    """Ops handler emitting CuTe DSL scalar code; see the module docstring."""

    # the dtypes a loaded or converted value may have (a subclass may widen it)
    SUPPORTED: tuple[torch.dtype, ...] = _SUPPORTED
    # dtypes a value may be cast to only to be stored (see the module docstring)
    STORE_ONLY: tuple[torch.dtype, ...] = ()

    def __init__(self, load_value: LoadValue, prefix: str = "tmp"):
        self.load_value = load_value
        self.prefix = prefix
        self.lines: list[str] = []
        self.stores: dict[str, str] = {}
        self._dtype: dict[str, torch.dtype] = {}
        self._const: dict[str, Any] = {}  # temps that hold Python constants
        self._cse: dict[str, str] = {}

    # -- bookkeeping ----------------------------------------------------------------

    def dtype_of(self, name: str) -> torch.dtype:
        return self._dtype[name]

    def _emit(self, expr: str, dtype: torch.dtype, const: Any = None) -> str:
        if expr in self._cse:
            return self._cse[expr]
        name = f"{self.prefix}{len(self.lines)}"
        self.lines.append(f"{name} = {expr}")
        self._dtype[name] = dtype
        if const is not None:
            self._const[name] = const
        self._cse[expr] = name
        return name

    def _default(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        raise _unsupported(name)

    def _const_temp(self, op: str, value: Any, dtype: torch.dtype) -> str:
        if dtype in _FLOATS:
            # Unrounded, in fp32, as Inductor's Triton code keeps a 16-bit constant (its
            # compute type): flex's score / 30 is a bf16-typed multiply by 1/30.
            value = float(value)
            if math.isnan(value):
                text = "float('nan')"
            elif math.isinf(value):
                text = "float('inf')" if value > 0 else "float('-inf')"
            else:
                text = repr(value)
            return self._emit(f"cutlass.Float32({text})", torch.float32, value)
        if dtype == torch.bool:
            return self._emit(f"cutlass.Boolean({bool(value)})", torch.bool, bool(value))
        if dtype in (torch.int32, torch.int64) and dtype in self.SUPPORTED and isinstance(
                value, (bool, int)):
            if dtype == torch.int32 and not _INT32_RANGE[0] <= int(value) <= _INT32_RANGE[1]:
                raise _unsupported(op, f"integer constant {value} does not fit int32")
            return self._emit(f"{cutlass_dtype_name(dtype)}({int(value)})", dtype, int(value))
        raise _unsupported(op, f"constant of dtype {dtype}")

    def _temp(self, op: str, x: Any, like: torch.dtype | None = None) -> str:
        """x as a known temp; a Python scalar becomes a constant of ``like``'s kind."""
        if isinstance(x, OpsValue):
            x = x.value
        if isinstance(x, str) and x in self._dtype:
            return x
        if isinstance(x, bool):
            return self._const_temp(op, x, torch.bool)
        if isinstance(x, int):
            kind = torch.float32 if like in _FLOATS else (
                torch.int64 if like == torch.int64 else torch.int32)
            return self._const_temp(op, x, kind)
        if isinstance(x, float):
            return self._const_temp(op, x, torch.float32)
        raise _unsupported(op, f"operand {x!r} is not a value of this handler")

    def _to(self, x: str, dtype: torch.dtype) -> str:
        """Convert temp x to dtype (float32, bfloat16, float16, int32, bool)."""
        src = self._dtype[x]
        if src == dtype:
            return x
        if src in self.STORE_ONLY:
            raise _unsupported("to_dtype", f"a {src} value is only stored")
        if x in self._const and dtype in (torch.float32, torch.bool, torch.int32, torch.int64):
            value = self._const[x]
            if dtype == torch.int32 and isinstance(value, float) and math.isfinite(value):
                value = int(value)  # truncation, as the conversion would do
            return self._const_temp("to_dtype", value, dtype)
        if dtype == torch.bool:
            if src in _FLOAT16:
                x = self._to(x, torch.float32)
            return self._emit(f"cutlass.Boolean({x})", torch.bool)  # x != 0 (NaN: True)
        if dtype in _FLOAT16 and src != torch.float32:
            x = self._to(x, torch.float32)
        elif dtype == torch.int32 and src in _FLOAT16:
            x = self._to(x, torch.float32)
        return self._emit(f"{x}.to({cutlass_dtype_name(dtype)})", dtype)

    def _promote(self, op: str, *args: Any,
                 allow_bool: bool = False) -> tuple[list[str], torch.dtype]:
        """Operands converted to one compute dtype: float32 if any is a float, else
        int64 or int32 if any is an int (the wider wins), else bool (only where
        ``allow_bool``)."""
        args = tuple(a.value if isinstance(a, OpsValue) else a for a in args)
        known = [self._dtype[a] for a in args if isinstance(a, str) and a in self._dtype]
        if any(d in self.STORE_ONLY for d in known):
            raise _unsupported(op, "a value cast for its store is used again")
        scalars = [a for a in args if isinstance(a, (bool, int, float))]
        if any(d in _FLOATS for d in known) or any(isinstance(s, float) for s in scalars):
            dtype = torch.float32
        elif torch.int64 in known:  # only where SUPPORTED has it
            dtype = torch.int64
        elif torch.int32 in known or any(type(s) is int for s in scalars):
            dtype = torch.int32
        else:
            dtype = torch.bool
            if not allow_bool:
                raise _unsupported(op, "arithmetic on bool values")
        temps = [self._to(self._temp(op, a, dtype), dtype) for a in args]
        return temps, dtype

    def _float(self, op: str, x: Any) -> str:
        return self._to(self._temp(op, x, torch.float32), torch.float32)

    def _unary_math(self, op: str, fn: str, x: Any, fast: bool = False) -> str:
        fastmath = ", fastmath=True" if fast else ""
        return self._emit(f"cute.math.{fn}({self._float(op, x)}{fastmath})", torch.float32)

    def _binary(self, op: str, a: Any, b: Any, sym: str) -> str:
        (a, b), dtype = self._promote(op, a, b)
        return self._emit(f"{a} {sym} {b}", dtype)

    def _compare(self, op: str, a: Any, b: Any, sym: str) -> str:
        (a, b), _ = self._promote(op, a, b, allow_bool=True)
        return self._emit(f"{a} {sym} {b}", torch.bool)

    def _bool(self, op: str, x: Any) -> str:
        return self._to(self._temp(op, x, torch.bool), torch.bool)

    # -- memory ---------------------------------------------------------------------

    def load(self, name: str, index: Any) -> str:
        got = self.load_value(name, index)
        expr, dtype = got if isinstance(got, tuple) else (got, torch.float32)
        if dtype not in self.SUPPORTED:
            raise _unsupported("load", f"buffer {name} of dtype {dtype}")
        if dtype in _FLOAT16:  # 16-bit values are computed in fp32
            return self._emit(f"({expr}).to(cutlass.Float32)", torch.float32)
        if dtype == torch.bool:  # a bool tensor's element is a byte in memory
            return self._emit(f"({expr}).to(cutlass.Boolean)", torch.bool)
        return self._emit(expr, dtype)

    def store(self, name: str, index: Any, value: Any, mode: Any = None) -> None:
        if mode is not None:
            raise _unsupported("store", f"store mode {mode}")
        self.stores[name] = self._temp("store", value)

    # -- constants and casts ----------------------------------------------------------

    def constant(self, value: Any, dtype: torch.dtype) -> str:
        return self._const_temp("constant", value, dtype)

    def to_dtype(self, x: Any, dtype: torch.dtype, src_dtype: Any = None,
                 use_compute_types: bool = True) -> str:
        if dtype in self.STORE_ONLY:  # fp32 until the caller's store rounds it
            return self._emit(self._float("to_dtype", x), dtype)
        if dtype not in self.SUPPORTED:
            raise _unsupported("to_dtype", f"target dtype {dtype}")
        if use_compute_types and dtype in _FLOAT16:
            dtype = torch.float32  # the compute type, as ``triton_compute_type`` gives
        return self._to(self._temp("to_dtype", x, dtype), dtype)

    # -- arithmetic -------------------------------------------------------------------

    def add(self, a: Any, b: Any) -> str:
        return self._binary("add", a, b, "+")

    def sub(self, a: Any, b: Any) -> str:
        return self._binary("sub", a, b, "-")

    def mul(self, a: Any, b: Any) -> str:
        return self._binary("mul", a, b, "*")

    def truediv(self, a: Any, b: Any) -> str:
        return self._emit(f"{self._float('truediv', a)} * "
                          f"cute.arch.rcp_approx({self._float('truediv', b)})", torch.float32)

    def neg(self, x: Any) -> str:
        (x,), dtype = self._promote("neg", x)
        return self._emit(f"-{x}", dtype)

    def reciprocal(self, x: Any) -> str:
        return self.truediv(1.0, x)

    def square(self, x: Any) -> str:
        return self.mul(x, x)

    def maximum(self, a: Any, b: Any) -> str:
        return self._minmax("maximum", "max", a, b)

    def minimum(self, a: Any, b: Any) -> str:
        return self._minmax("minimum", "min", a, b)

    def _minmax(self, op: str, fn: str, a: Any, b: Any) -> str:
        (a, b), dtype = self._promote(op, a, b)
        nan = ", propagate_nan=True" if dtype == torch.float32 else ""  # torch: NaN wins
        return self._emit(f"cute.math.{fn}({a}, {b}{nan})", dtype)

    def relu(self, x: Any) -> str:
        (x,), dtype = self._promote("relu", x)
        return self._minmax("relu", "max", x, self._const_temp("relu", 0, dtype))

    def abs(self, x: Any) -> str:
        (x,), dtype = self._promote("abs", x)
        return self._emit(f"cute.math.{'abs' if dtype == torch.float32 else 'absi'}({x})",
                          dtype)

    # -- transcendental (all exist in cute.math of CuTe DSL 4.8) ------------------------

    def exp(self, x: Any) -> str:
        return self._unary_math("exp", "exp", x, fast=True)

    def log(self, x: Any) -> str:
        return self._unary_math("log", "log", x, fast=True)

    def tanh(self, x: Any) -> str:
        return self._unary_math("tanh", "tanh", x)

    def erf(self, x: Any) -> str:
        return self._unary_math("erf", "erf", x, fast=True)

    def sqrt(self, x: Any) -> str:
        return self._unary_math("sqrt", "sqrt", x)

    def rsqrt(self, x: Any) -> str:
        return self._unary_math("rsqrt", "rsqrt", x)

    def sigmoid(self, x: Any) -> str:  # 1 / (1 + exp(-x)): 0 and 1 at the extremes
        x = self._float("sigmoid", x)
        return self.truediv(1.0, self.add(1.0, self.exp(self.neg(x))))

    # -- comparisons and logic ----------------------------------------------------------

    def eq(self, a: Any, b: Any) -> str:
        return self._compare("eq", a, b, "==")

    def ne(self, a: Any, b: Any) -> str:
        return self._compare("ne", a, b, "!=")

    def lt(self, a: Any, b: Any) -> str:
        return self._compare("lt", a, b, "<")

    def le(self, a: Any, b: Any) -> str:
        return self._compare("le", a, b, "<=")

    def gt(self, a: Any, b: Any) -> str:
        return self._compare("gt", a, b, ">")

    def ge(self, a: Any, b: Any) -> str:
        return self._compare("ge", a, b, ">=")

    def logical_and(self, a: Any, b: Any) -> str:
        return self._emit(f"{self._bool('logical_and', a)} & {self._bool('logical_and', b)}",
                          torch.bool)

    def logical_or(self, a: Any, b: Any) -> str:
        return self._emit(f"{self._bool('logical_or', a)} | {self._bool('logical_or', b)}",
                          torch.bool)

    def logical_not(self, x: Any) -> str:
        return self._emit(f"~{self._bool('logical_not', x)}", torch.bool)

    def where(self, condition: Any, a: Any, b: Any) -> str:
        cond = self._bool("where", condition)
        (a, b), dtype = self._promote("where", a, b, allow_bool=True)
        if cond in self._const:  # select_ needs a dynamic condition
            return a if self._const[cond] else b
        return self._emit(f"{cutlass_dtype_name(dtype)}(cutlass.select_({cond}, {a}, {b}))",
                          dtype)

    # -- explicitly not fusable ------------------------------------------------------------

    def index_expr(self, expr: Any, dtype: torch.dtype) -> str:
        raise _unsupported("index_expr", "values computed from indices")

    def indirect_indexing(self, x: Any, size: Any, check: bool = True,
                          wrap_neg: bool = True) -> Any:
        raise _unsupported("indirect_indexing", "data-dependent indexing")

    # -- driver ---------------------------------------------------------------------------

    def run(self, fn: Any, index: Sequence[Any]) -> str:
        """Evaluate a pointwise body under this handler; the name of its value.

        ``fn``: an ``ir.Pointwise`` (or a ComputedBuffer/TensorBox holding one), a
        ``LoopBody`` (its single store is the value), or any ``inner_fn(index)``."""
        from torch._inductor import ir
        from torch._inductor.loop_body import LoopBody

        while isinstance(fn, (ir.TensorBox, ir.StorageBox, ir.ComputedBuffer)):
            fn = fn.data
        if isinstance(fn, ir.Loops):
            if type(fn) is not ir.Pointwise:
                raise _unsupported(type(fn).__name__, "only plain Pointwise nodes")
            fn = fn.inner_fn
        with V.set_ops_handler(self):
            if isinstance(fn, LoopBody):
                fn(list(index), [])
                out = None
            else:
                out = fn(list(index))
        if isinstance(out, OpsValue):
            out = out.value
        if out is None:
            if len(self.stores) != 1:
                raise _unsupported("store", f"expected one store, got {len(self.stores)}")
            out = next(iter(self.stores.values()))
        return self._temp("result", out)


def translate_pointwise(fn: Any, index: Sequence[Any], load_value: LoadValue,
                        prefix: str = "tmp", store_only: tuple[torch.dtype, ...] = ()
                        ) -> Translation:
    """Translate one pointwise body (see ``PointwiseToCuteDSL.run``) into CuTe DSL lines;
    ``store_only``: the handler's ``STORE_ONLY``.

    Raises ``NotImplementedError`` when the body is not fusable."""
    handler = PointwiseToCuteDSL(load_value, prefix=prefix)
    handler.STORE_ONLY = store_only
    result = handler.run(fn, index)
    return Translation(list(handler.lines), result, handler.dtype_of(result))
