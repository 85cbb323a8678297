"""Fused epilogues: pointwise consumers of a template's output, computed inside it.

``plan_epilogue(template_buffer, consumers)`` translates Inductor pointwise nodes (in
the order they consume each other) into ``@cute.jit`` functions the template calls on
every output element, in fp32. In one call::

    <kernel>_epilogue(value, c0, c1, extras) -> result  # c0, c1: the element's coordinates

or in two phases, so that a template can issue an element's global loads well before it
computes (the GEMM loads a sub-tile's inputs while it stores the previous one)::

    loaded = <kernel>_epilogue_registers(count)          # registers for count elements
    <kernel>_epilogue_load(loaded, i, c0, c1, extras)    # element i's loads, raw
    <kernel>_epilogue_load_pair(loaded, i, c0, c1, extras)  # or elements i and i + 1 at
                                   # (.., c1) and (.., c1 + 1), c1 even: one vector load
                                   # where the input is contiguous along the last dimension
    <kernel>_epilogue_apply(value, loaded, i, c0, c1, extras) -> result

Loads are resolved per buffer: the template's output at the element's own position is
``value``; an earlier consumer's output at its own position is that consumer's result;
any other buffer is an extra input, read through a flat view (``extras[i]``) at the
storage index Inductor computes from the coordinates (a bias row or column, a residual,
a broadcast scalar). Extra inputs of float dtypes are read in the load phase into
``loaded`` (one register fragment per distinct load, in the buffer's dtype, so nothing
waits for the data until ``apply`` converts it); others are read inline by ``apply``.
The last consumer's buffer becomes the kernel's output; the template's own output and
the intermediate buffers are never written. Storage indices are Int32 arithmetic when
the buffer is known to hold fewer than 2**31 elements, Int64 otherwise (so a huge
residual never wraps around).

Invariants: every consumer iterates over exactly the template output's shape, writes a
contiguous buffer, reads the template output (or an earlier consumer) only at the
element being computed, and its indexing uses no symbols besides the coordinates; the
fused output is one the template stores (``CuteDSLTemplate.fused_output_error``: fp32,
bf16 or fp16 unless it says more). A float8 output (the GEMM's: the next layer's input
quantized with a scale the graph already has) is a cast the last consumer ends with:
the result stays fp32 and the template's store rounds it (``STORE_ONLY``, ``pointwise.py``;
Hopper's conversion saturates to the largest finite value where torch's eager cast of an
out-of-range value gives NaN, as Inductor's Triton kernels do). Failure semantics: anything
else -- and any op ``PointwiseToCuteDSL`` cannot translate -- raises
``NotImplementedError``; the scheduler then leaves the nodes unfused.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import sympy
import torch
from torch._inductor import ir
from torch._inductor.codegen.common import PythonPrinter
from torch._inductor.virtualized import V

from ..compile.dtypes import cutlass_dtype_name
from ..compile.specs import is_aligned
from .pointwise import translate_pointwise


class RegisterLoad(NamedTuple):
    """One element of extra input ``extras[extra]``, at storage index ``index`` (text);
    ``next_index`` is that of the element one step on along the last coordinate, and
    ``contiguous`` says that it is ``index + 1`` and that ``index`` is even whenever the
    last coordinate is (so one aligned vector load reads both); ``at_output``: the
    index is the template output's own storage index of the element."""

    extra: int
    index: str
    dtype: torch.dtype
    next_index: str
    contiguous: bool
    at_output: bool

    @property
    def expr(self) -> str:
        return f"extras[{self.extra}][{self.index}]"


@dataclasses.dataclass
class EpiloguePlan:
    lines: list[str]  # body of the apply function
    result: str  # the temp holding the fp32 result
    extra_buffers: list[str]  # buffers read through ``extras``, in order
    output: Any  # the IR buffer that receives the fused result (None: no epilogue)
    fused_names: list[str]  # template and consumer buffers replaced by ``output``
    # the load phase, one register fragment ``loaded[j]`` per entry
    register_loads: list[RegisterLoad] = dataclasses.field(default_factory=list)
    # j of a register load that reads an input laid out like the fused output (same
    # storage index, same 16-bit dtype, 16-byte aligned: a residual), or None; a template
    # may load it a tile at a time (the GEMM: by TMA) and fill ``loaded[j]`` itself
    tile_input: int | None = None

    def function_source(self, name: str, rank: int, tile_input: bool = False) -> str:
        """The five functions of the module docstring, ``name`` being the one-call form;
        with ``tile_input`` the pair loads leave out ``self.tile_input`` (the template
        fills that fragment)."""
        coords = ", ".join(coordinate_names(rank))
        fragments = "".join(f"cute.make_rmem_tensor((count,), {cutlass_dtype_name(r.dtype)}), "
                            for r in self.register_loads)
        loads = [f"loaded[{j}][i] = {r.expr}" for j, r in enumerate(self.register_loads)]
        pairs = []
        for j, r in enumerate(self.register_loads):
            if tile_input and j == self.tile_input:
                continue
            if r.contiguous:
                pairs += [f"pair{j} = cute.make_tensor(extras[{r.extra}].iterator + cute.assume("
                          f"{r.index}, divby=2), cute.make_layout(2)).load()",
                          f"loaded[{j}][i] = pair{j}[0]", f"loaded[{j}][i + 1] = pair{j}[1]"]
            else:
                pairs += [f"loaded[{j}][i] = {r.expr}",
                          f"loaded[{j}][i + 1] = extras[{r.extra}][{r.next_index}]"]
        functions = [
            (f"{name}_registers(count)", [f"return ({fragments})"]),
            (f"{name}_load(loaded, i, {coords}, extras)", loads or ["pass"]),
            (f"{name}_load_pair(loaded, i, {coords}, extras)", pairs or ["pass"]),
            (f"{name}_apply(value, loaded, i, {coords}, extras)",
             [*self.lines, f"return {self.result}"]),
            (f"{name}(value, {coords}, extras)", [
                f"loaded = {name}_registers(1)",
                f"{name}_load(loaded, 0, {coords}, extras)",
                f"return {name}_apply(value, loaded, 0, {coords}, extras)"]),
        ]
        return "\n".join("\n".join(["@cute.jit", f"def {signature}:",
                                     *(f"    {line}" for line in body)]) + "\n"
                         for signature, body in functions)


# what a template stores: the fused result is cast to the output's dtype
OUTPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# casts to these are left to the store (a template that stores them says so)
FLOAT8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)

# extra inputs of these dtypes are read in the load phase, into register fragments
REGISTER_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

IDENTITY = EpiloguePlan(lines=[], result="value", extra_buffers=[], output=None, fused_names=[])


def coordinate_names(rank: int) -> list[str]:
    return [f"c{d}" for d in range(rank)]


def plan_epilogue(template_buffer: Any, consumers: list[Any]) -> EpiloguePlan:
    """The fused epilogue of ``consumers`` (IR ComputedBuffers) after ``template_buffer``."""
    loads = EpilogueLoads(template_buffer)
    lines: list[str] = []
    result = "value"
    for number, consumer in enumerate(consumers):
        if list(consumer.get_size()) != loads.size:
            raise NotImplementedError("the consumer iterates over another shape")
        if not consumer.get_layout().is_contiguous():
            raise NotImplementedError("the consumer's output is not contiguous")
        translation = translate_pointwise(consumer, loads.coords, loads.load_value,
                                          prefix=f"e{number}_", store_only=FLOAT8_DTYPES)
        lines += translation.lines
        result = translation.result
        loads.produced(consumer, result, translation.dtype)
    if consumers:
        why = template_buffer.template.fused_output_error(template_buffer.params, consumers[-1])
        if why is not None:
            raise NotImplementedError(why)
    if consumers and loads.values[consumers[-1].get_name()][1] not in (torch.float32,
                                                                        *FLOAT8_DTYPES):
        lines.append(f"epilogue_result = {result}.to(cutlass.Float32)")
        result = "epilogue_result"
    # at_output compares with the template buffer's index; the tile input must be laid
    # out like the fused output, which the template stores
    output_like_template = bool(consumers) and sympy.simplify(
        _position(consumers[-1], loads.coords) - loads.output_position) == 0
    tile_input = next((
        j for j, r in enumerate(loads.register_loads)
        if output_like_template and r.at_output and r.dtype == consumers[-1].get_dtype()
        and r.dtype.itemsize == 2 and is_aligned(V.graph.get_buffer(loads.extra_buffers[r.extra]))
    ), None)
    return EpiloguePlan(
        lines=lines, result=result, extra_buffers=loads.extra_buffers,
        register_loads=loads.register_loads, output=consumers[-1] if consumers else None,
        fused_names=[template_buffer.get_name()] + [c.get_name() for c in consumers[:-1]],
        tile_input=tile_input,
    )


class EpilogueLoads:
    """Resolves the epilogue's buffer reads (``load_value`` for the translator): values
    computed in the kernel (the template output, earlier consumers) at the element's own
    position, everything else as an extra input read at its storage index."""

    def __init__(self, template_buffer: Any) -> None:
        self.size = list(template_buffer.get_size())
        self.names = coordinate_names(len(self.size))
        self.coords = [sympy.Symbol(n, integer=True, nonnegative=True) for n in self.names]
        # buffer -> (expression, dtype) and the storage index of the element in it
        self.values: dict[str, tuple[str, torch.dtype]] = {}
        self.positions: dict[str, Any] = {}
        self.extra_buffers: list[str] = []
        self.register_loads: list[RegisterLoad] = []
        self.produced(template_buffer, "value", torch.float32)
        self.output_position = self.positions[template_buffer.get_name()]

    def produced(self, buffer: Any, expr: str, dtype: torch.dtype) -> None:
        self.values[buffer.get_name()] = (expr, dtype)
        self.positions[buffer.get_name()] = _position(buffer, self.coords)

    def load_value(self, name: str, index: Any) -> tuple[str, torch.dtype]:
        if name in self.values:
            if sympy.simplify(index - self.positions[name]) != 0:
                raise NotImplementedError(f"reads {name} at another element ({index})")
            return self.values[name]
        free = {str(s) for s in sympy.sympify(index).free_symbols}
        if not free <= set(self.names):
            raise NotImplementedError(f"index of {name} needs runtime sizes ({index})")
        if name not in self.extra_buffers:
            self.extra_buffers.append(name)
        index = sympy.sympify(index)
        last = self.coords[-1]
        next_index = index.subs(last, last + 1)
        contiguous = (sympy.expand(next_index - index) == 1 and all(
            coefficient.is_integer and coefficient % 2 == 0
            for coefficient in sympy.expand(index - last).as_coefficients_dict().values()))
        at_output = sympy.simplify(index - self.output_position) == 0
        numel = V.graph.get_buffer(name).get_layout().storage_size()
        if not V.graph.sizevars.statically_known_lt(numel, 2**31):
            wide = {c: sympy.Symbol(f"cutlass.Int64({c})") for c in self.coords}
            index, next_index = index.subs(wide), next_index.subs(wide)
        printer = PythonPrinter()
        read = RegisterLoad(self.extra_buffers.index(name), printer.doprint(index),
                            V.graph.get_dtype(name), printer.doprint(next_index), contiguous,
                            at_output)
        if read.dtype not in REGISTER_DTYPES:
            return read.expr, read.dtype
        if read not in self.register_loads:
            self.register_loads.append(read)
        return f"loaded[{self.register_loads.index(read)}][i]", read.dtype


def _position(buffer: Any, coords: list[Any]) -> Any:
    """Storage index of the element at ``coords`` (a flexible layout as it stands now;
    the scheduler freezes it before the final plan is made)."""
    layout = buffer.get_layout()
    if isinstance(layout, ir.FlexibleLayout):
        layout = layout.as_fixed()
    return layout.make_indexer()(coords)
