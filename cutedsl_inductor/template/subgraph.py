"""Inductor subgraphs -> CuTe DSL statements: the ``{{modification(...)}}`` hook's engine.

A subgraph is what Inductor lowers a small traced function into for a template to
inline: flex_attention's ``score_mod(score, b, h, q_idx, kv_idx)`` and ``mask_mod(b, h,
q_idx, kv_idx)`` become, through ``build_subgraph_buffer``, a ``ComputedBuffer`` of a
``Pointwise`` over size ``[]`` (or of the ``InputBuffer`` it returns unchanged) whose
body loads its placeholders by name (``score``, ``b``, ``h``, ``m``, ``n``) and reads
captured tensors (ALiBi slopes, bias tables, document ids) at indices computed from
values (``indirect_indexing``). ``translate_modification`` runs that body under
``SubgraphToCuteDSL``, the pointwise translator of the fused epilogues
(``template/pointwise.py``) plus integer index arithmetic, ``index_expr``, indirect
indexing and bitwise logic, and returns straight-line statements that assign the
template's variable.

Invariants:
  * A placeholder reads the template's expression given for it (``index_vars``); its
    dtype is the hook's ``input_dtypes`` entry, else the subgraph's own
    (``ModificationSubgraph``); neither is guessed. Index values are Int32 (int64
    captured values too are computed as Int64 and narrowed to Int32 only to index).
  * A captured tensor must be one of the choice's input nodes (so autotuning times the
    choice on it). The code reads it as ``captures[k]``, a flat view the entry builds
    (``{{modification_inputs()}}``), at Inductor's storage index less the node's offset,
    in Int32 arithmetic (Int64 for a tensor of 2**31 elements or more). A negative index
    wraps as in eager PyTorch; where ``mask`` (a CuTe Boolean expression) is False every
    index is 0, so reads of elements outside the problem stay in bounds. Indices are not
    bounds-checked otherwise (as in Inductor's own flex templates).
  * A cast to bf16/fp16 computes in Float32, as Inductor's Triton code does (its
    compute type; ``PointwiseToCuteDSL.to_dtype``), so an index difference past 256 is
    not rounded to bf16's even values.
  * The result: a float is Float32 (a 16-bit result is upcast), a bool Boolean, an
    integer Int32/Int64. A list of scatters (a backward's gradients of captured tensors:
    ``output_name`` None) has no result: each becomes one fp32 atomic add
    (``cute.arch.red``) into its gradient buffer, an input node like a captured tensor,
    at its storage index; the caller guards the statements. Temps carry the caller's prefix, so several modifications (of one
    subgraph or several) coexist in one function; the text is deterministic.

Failure semantics: anything not translated (an op, a dtype, a runtime size in an index,
a captured tensor that is not an input node, a placeholder without a template value or
a dtype; a scatter that is not an atomic add of size [] into an fp32 input node) raises ``NotImplementedError`` naming it, before any text is emitted; the
hook turns it into ``SubgraphError`` (``exc.py``) and the choice is refused.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, NamedTuple

import sympy
import torch
from torch._inductor import ir
from torch._inductor.codegen.common import PythonPrinter
from torch._inductor.virtualized import OpsValue, V

from .pointwise import _SUPPORTED, PointwiseToCuteDSL, _unsupported

_INTS = (torch.int32, torch.int64)
DTYPE_NAMES = {"float32": torch.float32, "bfloat16": torch.bfloat16,
               "float16": torch.float16, "int32": torch.int32, "int64": torch.int64,
               "bool": torch.bool}


@dataclasses.dataclass(frozen=True)
class ModificationSubgraph:
    """A subgraph with its placeholders' dtypes, as a template's ``subgraphs`` entry
    (a bare ``ComputedBuffer`` works too; the hook's ``input_dtypes`` then types it)."""

    body: Any  # the ComputedBuffer build_subgraph_buffer returns
    input_dtypes: Mapping[str, torch.dtype]

    @classmethod
    def of(cls, body: Any, placeholders: list[Any]) -> "ModificationSubgraph":
        """``placeholders``: the TensorBoxes the subgraph was built on (``create_placeholder``);
        the captured buffers after them are skipped (they are read as tensors)."""
        return cls(body, {p.get_name(): p.get_dtype() for p in placeholders})


class Modification(NamedTuple):
    lines: list[str]  # statements, the last one ``<output_name> = <result>``
    dtype: torch.dtype | None  # the result's dtype (None: scatter stores, no result)
    captured: list[str]  # captured buffers read, in order of first read


class Captures:
    """The captured tensors of one kernel's modifications: buffer name -> its place in
    the ``captures`` tuple and the input node it is."""

    def __init__(self, input_nodes: list[Any]) -> None:
        self.input_nodes = list(input_nodes)
        self.names: list[str] = []  # captures[k] is the input node named names[k]

    def node(self, name: str) -> Any:
        nodes = [n for n in self.input_nodes if n.get_name() == name]
        if len(nodes) != 1:
            why = "is not among" if not nodes else f"is {len(nodes)} views of one buffer among"
            raise _unsupported("load", f"captured tensor {name} {why} the choice's input "
                                       "nodes (pass the subgraph's captured buffers as inputs)")
        return nodes[0]

    def slot(self, name: str) -> int:
        self.node(name)
        if name not in self.names:
            self.names.append(name)
        return self.names.index(name)

    def input_indices(self) -> list[int]:
        """For each ``captures[k]``, the index of its node in ``input_nodes``."""
        return [next(i for i, n in enumerate(self.input_nodes) if n.get_name() == name)
                for name in self.names]


class SubgraphToCuteDSL(PointwiseToCuteDSL):
    """``PointwiseToCuteDSL`` plus what subgraphs do with indices; see the docstring."""

    SUPPORTED = (*_SUPPORTED, torch.int64)

    def __init__(self, index_vars: Mapping[str, str], input_dtypes: Mapping[str, torch.dtype],
                 captures: Captures, prefix: str, mask: str | None = None) -> None:
        super().__init__(self._resolve, prefix=prefix)
        self.index_vars = dict(index_vars)
        self.input_dtypes = dict(input_dtypes)
        self.captures = captures
        self.captured: list[str] = []
        self.indices: set[sympy.Symbol] = set()  # the Int32 temps indirect_indexing made
        self.scattered: list[str] = []  # the buffers atomically added into, in order
        self.mask = None if mask is None else self._emit(f"cutlass.Boolean({mask})", torch.bool)

    # -- loads ------------------------------------------------------------------------

    def _resolve(self, name: str, index: Any) -> tuple[str, torch.dtype]:
        if name in self.index_vars:
            if name not in self.input_dtypes:
                raise _unsupported("load", f"placeholder {name} has no dtype: give it in "
                                           "input_dtypes= or pass a ModificationSubgraph")
            if sympy.sympify(index) != 0:
                raise _unsupported("load", f"placeholder {name} read at index {index}")
            return f"({self.index_vars[name]})", self.input_dtypes[name]
        if name in self.input_dtypes:
            raise _unsupported("load", f"placeholder {name} has no value: pass {name}=... "
                                       "to the hook")
        node = self.captures.node(name)
        text = self._flat_index("load", name, node, index)
        if name not in self.captured:
            self.captured.append(name)
        return f"captures[{self.captures.slot(name)}][{text}]", node.get_dtype()

    def _flat_index(self, op: str, name: str, node: Any, index: Any) -> str:
        """Inductor's storage index of captured ``node`` less its offset, as CuTe text
        (Int64 arithmetic for a tensor of 2**31 elements or more)."""
        index = sympy.expand(sympy.sympify(index) - node.get_layout().offset)
        stray = index.free_symbols - self.indices
        if stray:
            names = ", ".join(sorted(map(str, stray)))
            raise _unsupported(op, f"index of {name} needs runtime values ({names})")
        if not V.graph.sizevars.statically_known_lt(node.get_layout().storage_size(), 2**31):
            index = index.subs({s: sympy.Symbol(f"cutlass.Int64({s})") for s in self.indices})
        return PythonPrinter().doprint(index)

    # -- scatter stores (a backward's gradients of captured tensors) --------------------

    def store(self, name: str, index: Any, value: Any, mode: Any = None) -> None:
        if mode is None:
            return super().store(name, index, value)
        if mode != "atomic_add":
            raise _unsupported("store", f"store mode {mode} into {name}")
        node = self.captures.node(name)
        if node.get_dtype() != torch.float32:
            raise _unsupported("store", f"an atomic add into {name} of dtype "
                                        f"{node.get_dtype()} (fp32 only)")
        text = self._flat_index("store", name, node, index)
        value = self._float("store", value)
        self.lines.append(f"cute.arch.red(captures[{self.captures.slot(name)}].iterator + "
                          f"({text}), {value}, op='add', dtype=cutlass.Float32, "
                          "sem='relaxed', scope='gpu')")
        self.scattered.append(name)

    # -- indices ----------------------------------------------------------------------

    def indirect_indexing(self, x: Any, size: Any, check: bool = True,
                          wrap_neg: bool = True) -> sympy.Expr:
        (x,), dtype = self._promote("indirect_indexing", x)
        if dtype not in _INTS:
            raise _unsupported("indirect_indexing", f"an index of dtype {dtype}")
        if not isinstance(size, (int, sympy.Integer)):
            raise _unsupported("indirect_indexing", f"runtime size {size}")
        if x in self._const:
            value = self._const[x]
            if wrap_neg and value < 0:
                value += int(size)
            return sympy.Integer(value)  # in bounds or not, whatever the mask says
        if wrap_neg:
            wrapped = self.add(x, int(size))
            x = self.where(self.lt(x, 0), wrapped, x)
        x = self._to(x, torch.int32)
        if self.mask is not None:
            x = self.where(self.mask, x, 0)
        symbol = sympy.Symbol(x, integer=True)
        self.indices.add(symbol)
        return symbol

    def index_expr(self, expr: Any, dtype: torch.dtype) -> str:
        expr = sympy.sympify(expr)
        if expr.free_symbols - self.indices:
            raise _unsupported("index_expr", f"runtime values in {expr}")
        if expr.is_Integer:
            value = self._const_temp("index_expr", int(expr), torch.int32)
        else:
            value = self._emit(f"cutlass.Int32({PythonPrinter().doprint(expr)})", torch.int32)
        return value if dtype in _INTS else self.to_dtype(value, dtype)

    # -- integer arithmetic -------------------------------------------------------------

    def _ints(self, op: str, a: Any, b: Any) -> tuple[str, str, torch.dtype]:
        (a, b), dtype = self._promote(op, a, b)
        if dtype not in _INTS:
            raise _unsupported(op, f"operands of dtype {dtype}")
        return a, b, dtype

    def floordiv(self, a: Any, b: Any) -> str:  # Python's //: rounds toward -inf
        a, b, dtype = self._ints("floordiv", a, b)
        return self._emit(f"{a} // {b}", dtype)

    def remainder(self, a: Any, b: Any) -> str:  # Python's %: the divisor's sign
        a, b, _ = self._ints("remainder", a, b)
        return self.sub(a, self.mul(self.floordiv(a, b), b))

    def truncdiv(self, a: Any, b: Any) -> str:  # C's /: rounds toward 0
        a, b, _ = self._ints("truncdiv", a, b)
        floor = self.floordiv(a, b)
        inexact = self.ne(self.mul(floor, b), a)
        signs_differ = self.ne(self.lt(a, 0), self.lt(b, 0))
        return self.where(self.logical_and(inexact, signs_differ), self.add(floor, 1), floor)

    def mod(self, a: Any, b: Any) -> str:  # C's %: the dividend's sign
        a, b, _ = self._ints("mod", a, b)
        return self.sub(a, self.mul(self.truncdiv(a, b), b))

    def int_truediv(self, a: Any, b: Any) -> str:
        return self.truediv(a, b)

    # -- bitwise logic (bool: logical) ----------------------------------------------------

    def _bitwise(self, op: str, a: Any, b: Any, sym: str) -> str:
        (a, b), dtype = self._promote(op, a, b, allow_bool=True)
        if dtype not in (*_INTS, torch.bool):
            raise _unsupported(op, f"operands of dtype {dtype}")
        return self._emit(f"{a} {sym} {b}", dtype)

    def bitwise_and(self, a: Any, b: Any) -> str:
        return self._bitwise("bitwise_and", a, b, "&")

    def bitwise_or(self, a: Any, b: Any) -> str:
        return self._bitwise("bitwise_or", a, b, "|")

    def bitwise_xor(self, a: Any, b: Any) -> str:
        return self._bitwise("bitwise_xor", a, b, "^")

    def bitwise_not(self, x: Any) -> str:
        (x,), dtype = self._promote("bitwise_not", x, allow_bool=True)
        if dtype not in (*_INTS, torch.bool):
            raise _unsupported("bitwise_not", f"an operand of dtype {dtype}")
        return self._emit(f"~{x}", dtype)


def input_dtype(value: Any) -> torch.dtype:
    """A dtype given to the hook: a torch.dtype or its name ("int32")."""
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str) and value.removeprefix("torch.") in DTYPE_NAMES:
        return DTYPE_NAMES[value.removeprefix("torch.")]
    raise _unsupported("input_dtypes", f"{value!r} is not one of {sorted(DTYPE_NAMES)}")


def translate_modification(subgraph: Any, output_name: str | None,
                           index_vars: Mapping[str, str], captures: Captures, prefix: str,
                           mask: str | None = None,
                           input_dtypes: Mapping[str, Any] | None = None) -> Modification:
    """The statements computing ``subgraph`` (a ``ModificationSubgraph`` or the bare
    ``ComputedBuffer``) into ``output_name``; with ``output_name`` None, a list of scatter
    stores (``translate_scatters``). See the module docstring."""
    body, dtypes = subgraph, {}
    if isinstance(subgraph, ModificationSubgraph):
        body, dtypes = subgraph.body, dict(subgraph.input_dtypes)
    dtypes.update({k: input_dtype(v) for k, v in (input_dtypes or {}).items()})
    if output_name is None:
        return translate_scatters(body, index_vars, dtypes, captures, prefix, mask)
    if not output_name.isidentifier():
        raise _unsupported("modification", f"output name {output_name!r} is not an identifier")
    inner = _returned(body)
    if isinstance(inner, ir.InputBuffer):  # the subgraph returns a placeholder unchanged
        inner = inner.make_loader()
    elif not isinstance(inner, ir.Pointwise) or list(inner.get_size()):
        raise _unsupported(type(inner).__name__,
                           "a subgraph must be a pointwise body of size [] (no scatter)")
    handler = SubgraphToCuteDSL(index_vars, dtypes, captures, prefix, mask)
    result = handler.run(inner, [])
    if isinstance(result, OpsValue):
        result = result.value
    dtype = handler.dtype_of(result)
    if dtype in (torch.bfloat16, torch.float16):
        result, dtype = handler._to(result, torch.float32), torch.float32
    lines = [*handler.lines, f"{output_name} = {result}"]
    return Modification(lines, dtype, list(handler.captured))


def _returned(body: Any) -> Any:
    """What a subgraph's body computes: its ``Pointwise``, or the placeholder's
    ``InputBuffer`` it returns unchanged."""
    while isinstance(body, (ir.TensorBox, ir.StorageBox, ir.ComputedBuffer)):
        body = body.data
    return body


def returned_placeholder(subgraph: Any) -> str | None:
    """The name of the placeholder ``subgraph`` (a ``ModificationSubgraph`` or the bare
    body) returns unchanged, e.g. "score" for flex's identity score_mod; else None."""
    body = subgraph.body if isinstance(subgraph, ModificationSubgraph) else subgraph
    inner = _returned(body)
    return inner.get_name() if isinstance(inner, ir.InputBuffer) else None


def translate_scatters(body: Any, index_vars: Mapping[str, str],
                       input_dtypes: Mapping[str, torch.dtype], captures: Captures,
                       prefix: str, mask: str | None = None) -> Modification:
    """Statements for a list of scatters (flex's ``zeros_and_scatter`` lowered: a
    ``ComputedBuffer`` of an ``ir.Scatter`` of size [] in ``atomic_add`` mode, named after
    the fp32 gradient buffer it adds into, which must be an input node): each adds its
    value at its index with ``cute.arch.red`` (an fp32 atomic add). The adds are
    unconditional: the template guards the statements (elements outside the problem or
    masked). Refused (``NotImplementedError``): anything else in the list, another mode,
    a buffer that is not fp32 or not an input node, an index that needs runtime values."""
    if not isinstance(body, (list, tuple)):
        raise _unsupported(type(body).__name__, "a scatter subgraph must be a list of "
                                                "scatter stores")
    handler = SubgraphToCuteDSL(index_vars, input_dtypes, captures, prefix, mask)
    for scatter in body:
        if not (isinstance(scatter, ir.ComputedBuffer) and isinstance(scatter.data, ir.Scatter)):
            raise _unsupported(type(getattr(scatter, "data", scatter)).__name__,
                               "not a scatter store")
        if list(scatter.data.get_size()):
            raise _unsupported("store", f"a scatter into {scatter.get_name()} over "
                                        f"{scatter.data.get_size()} elements (size [] only)")
        stride = captures.node(scatter.get_name()).get_stride()

        def storage_index(idx: Any, stride: Any = stride) -> Any:
            return sum(i * s for i, s in zip(idx, stride))

        with V.set_ops_handler(handler):
            scatter.data.store_output(scatter.get_name(), storage_index, [])
    return Modification(list(handler.lines), None, list(handler.captured))
