"""Fused prologues: a pointwise producer of a template input, computed where the template
loads that input.

``plan_prologue(template_buffer, producer)`` translates the Inductor pointwise node that
writes one of the template's inputs (a cast, a scale, a multiply by a broadcast vector,
an add) into one ``@cute.jit`` function, in fp32, that the template calls on every
element of that input it loads::

    <kernel>_prologue(value, c0, c1, extras) -> result   # c0, c1: the element's coordinates

``value`` is the element of the producer's *source* as loaded: the first buffer it reads
at the element's own position with the same shape (fp32, bf16 or fp16; a dense tensor
with unit stride in one of its last two dimensions, 16-byte aligned strides and base, so
that a template can load it in tiles, by TMA). The fused kernel takes the source in the
input's place; the input itself is never written. Any other buffer the producer reads (a
per-column weight such as RMSNorm's, a per-row scale, a scalar, a second tensor) is an
extra input, read through a flat view (``extras[i]``) at the storage index Inductor
computes from the coordinates (Int64 arithmetic where the buffer may hold 2**31
elements or more). The template converts the fp32 result to the dtype it computes in.

A template declares which input it can transform with ``{{def_prologue("a")}}`` (the
name ``def_kernel`` gives it); the scheduler offers the plan to every template that has
the hook, and a choice whose rendering does not claim the planned input is refused.

Failure semantics: a producer that is not a plain pointwise node over the input's shape,
reads no source, indexes with runtime sizes, or contains an op ``PointwiseToCuteDSL``
cannot translate raises ``NotImplementedError``; the scheduler leaves it unfused.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import sympy
import torch
from torch._inductor import ir
from torch._inductor.codegen.common import PythonPrinter
from torch._inductor.virtualized import V

from ..compile.specs import is_aligned
from .epilogue import coordinate_names
from .pointwise import translate_pointwise

# what a template loads as the source: its element reaches the prologue as fp32
SOURCE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclasses.dataclass
class ProloguePlan:
    lines: list[str]  # body of the function
    result: str  # the temp holding the fp32 result
    target: str  # the template input the producer writes (never written when fused)
    source: str  # the buffer the template loads in its place
    extra_buffers: list[str]  # buffers read through ``extras``, in order
    rank: int  # coordinates per element

    def function_source(self, name: str) -> str:
        coords = ", ".join(coordinate_names(self.rank))
        body = [*self.lines, f"return {self.result}"]
        return "\n".join(["@cute.jit", f"def {name}(value, {coords}, extras):",
                          *(f"    {line}" for line in body)]) + "\n"


def identity_source(name: str, rank: int) -> str:
    """The prologue function where nothing is fused."""
    return ProloguePlan([], "value", "", "", [], rank).function_source(name)


def plan_prologue(template_buffer: Any, producer: Any) -> ProloguePlan:
    """The fused prologue of ``producer`` (an IR ComputedBuffer that writes one of
    ``template_buffer``'s inputs, that input itself and not a view of it)."""
    target = producer.get_name()
    if not any(_unwrap(node).get_name() == target and not isinstance(_unwrap(node), ir.BaseView)
               for node in template_buffer.inputs):
        raise NotImplementedError(f"{target} is not an input of the template, or a view of one")
    loads = PrologueLoads(list(producer.get_size()))
    translation = translate_pointwise(producer, loads.coords, loads.load_value, prefix="p")
    if loads.source is None:
        raise NotImplementedError("the producer reads no tensor of its own shape at the "
                                  "element's position (nothing to load in its place)")
    lines, result = list(translation.lines), translation.result
    if translation.dtype != torch.float32:
        lines.append(f"prologue_result = {result}.to(cutlass.Float32)")
        result = "prologue_result"
    source = V.graph.get_buffer(loads.source)
    if isinstance(source.get_layout(), ir.FlexibleLayout):
        source.freeze_layout()  # the fused kernel's argument now
    return ProloguePlan(lines, result, target, loads.source, loads.extra_buffers,
                        len(loads.coords))


class PrologueLoads:
    """Resolves the producer's buffer reads: its source at the element's position is
    ``value``; everything else is an extra input read at its storage index."""

    def __init__(self, size: list[Any]) -> None:
        self.size = size
        self.names = coordinate_names(len(size))
        self.coords = [sympy.Symbol(n, integer=True, nonnegative=True) for n in self.names]
        self.source: str | None = None
        self.extra_buffers: list[str] = []

    def load_value(self, name: str, index: Any) -> tuple[str, torch.dtype]:
        buffer = V.graph.get_buffer(name)
        if name == self.source or (self.source is None and self._loadable(buffer, index)):
            if name == self.source and sympy.simplify(index - _position(buffer, self.coords)):
                raise NotImplementedError(f"reads its source {name} at another element")
            self.source = name
            return "value", torch.float32
        free = {str(s) for s in sympy.sympify(index).free_symbols}
        if not free <= set(self.names):
            raise NotImplementedError(f"index of {name} needs runtime sizes ({index})")
        if name not in self.extra_buffers:
            self.extra_buffers.append(name)
        index = sympy.sympify(index)
        if not V.graph.sizevars.statically_known_lt(buffer.get_layout().storage_size(), 2**31):
            index = index.subs({c: sympy.Symbol(f"cutlass.Int64({c})") for c in self.coords})
        expr = f"extras[{self.extra_buffers.index(name)}][{PythonPrinter().doprint(index)}]"
        return expr, V.graph.get_dtype(name)

    def _loadable(self, buffer: Any, index: Any) -> bool:
        """Whether ``buffer``, read at ``index``, can be the source: the element's own
        position in a tensor of the producer's shape that a template can load in tiles."""
        if buffer.get_dtype() not in SOURCE_DTYPES or list(buffer.get_size()) != self.size:
            return False
        if len(self.size) < 2 or sympy.simplify(index - _position(buffer, self.coords)) != 0:
            return False
        stride = buffer.get_layout().stride
        unit = 16 // buffer.get_dtype().itemsize
        known = V.graph.sizevars
        dense = [d for d in (-1, -2) if known.statically_known_equals(stride[d], 1)]
        return bool(dense) and is_aligned(buffer) and all(
            known.statically_known_multiple_of(s, unit)
            for d, s in enumerate(stride) if d - len(stride) != dense[0])


def _position(buffer: Any, coords: list[Any]) -> Any:
    layout = buffer.get_layout()
    if isinstance(layout, ir.FlexibleLayout):
        layout = layout.as_fixed()
    return layout.make_indexer()(coords)


def _unwrap(node: Any) -> Any:
    while isinstance(node, ir.MutableBox):
        node = node.data
    return node
