"""Argument specs: what a compiled kernel binary assumes about each argument.

A ``TensorSpec`` holds dtype, rank, each size and stride as a static int or a ``Sym``
(a runtime value with a known divisibility) and the base pointer's byte alignment; a
``ScalarSpec`` is a runtime integer (an Inductor size variable). Specs are made once at
codegen time from Inductor's IR (``specs_for_nodes``), written into the output code as
reprs, and turned into CuTe DSL fake arguments at compile time (``fake_arguments``).

Invariants: ``spec.key()`` names everything about the argument that changes the binary,
so equal keys may share a binary. Two ``Sym`` with the same name are one runtime value.
The alignment is only claimed when Inductor guarantees it (its own buffers, or graph
inputs it copies when misaligned). TVM-FFI checks dtype, rank, static sizes and strides
and device at every call, so a spec that does not match its tensor is an error, never a
wrong result.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any, Union

import sympy
import torch

from .dtypes import cutlass_dtype

GPU_ALIGN_BYTES = 16


@dataclasses.dataclass(frozen=True)
class Sym:
    """A size or stride known only at run time, a multiple of ``divisibility``."""

    name: str
    divisibility: int = 1

    def key(self) -> str:
        return f"{self.name}%{self.divisibility}"


Dim = Union[int, Sym]


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    dtype: str  # torch dtype name without "torch.", e.g. "bfloat16"
    shape: tuple[Dim, ...]
    stride: tuple[Dim, ...]
    align: int  # bytes

    def key(self) -> str:
        dims = ",".join(d.key() if isinstance(d, Sym) else str(d) for d in self.shape)
        strides = ",".join(d.key() if isinstance(d, Sym) else str(d) for d in self.stride)
        return f"T[{self.dtype};{dims};{strides};a{self.align}]"

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @functools.cached_property
    def static_layout(self) -> tuple[torch.dtype, tuple[int, ...], tuple[int, ...]] | None:
        """(dtype, sizes, strides) where every size and stride is static, else None."""
        if any(isinstance(d, Sym) for d in (*self.shape, *self.stride)):
            return None
        return self.torch_dtype, self.shape, self.stride

    def describe(self) -> str:
        def show(d: Dim) -> str:
            return d.name if isinstance(d, Sym) else str(d)

        return (
            f"{self.dtype}[{', '.join(map(show, self.shape))}]"
            f"(stride {', '.join(map(show, self.stride))})"
        )


@dataclasses.dataclass(frozen=True)
class ScalarSpec:
    dtype: str = "int64"

    def key(self) -> str:
        return f"S[{self.dtype}]"

    def describe(self) -> str:
        return self.dtype


ArgSpec = Union[TensorSpec, ScalarSpec]


@dataclasses.dataclass(frozen=True)
class Workspace:
    """Scratch memory an entry takes right after its output: ``numel`` (static) elements
    of ``dtype``, zeroed before every call where ``zeroed``. Whoever calls the entry makes
    it for that call alone (Inductor's output code, the autotuner's timing): no state
    survives between calls."""

    numel: int
    dtype: str  # torch dtype name without "torch."
    zeroed: bool = True

    def spec(self) -> TensorSpec:
        return TensorSpec(self.dtype, (self.numel,), (1,), GPU_ALIGN_BYTES)

    def make(self, device: torch.device) -> torch.Tensor:
        make = torch.zeros if self.zeroed else torch.empty
        return make(self.numel, dtype=getattr(torch, self.dtype), device=device)


def static_ints(values: Any) -> list[int] | None:
    """``values`` (sizes, strides, offsets of IR nodes) as ints, or None if any is symbolic."""
    out = []
    for v in values:
        v = sympy.sympify(v)
        if not v.is_Integer:
            return None
        out.append(int(v))
    return out


def specs_key(specs: Sequence[ArgSpec]) -> str:
    return "|".join(spec.key() for spec in specs)


def describe_value(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        return (
            f"{dtype}[{', '.join(map(str, value.shape))}](stride "
            f"{', '.join(map(str, value.stride()))}) on {value.device}"
        )
    return f"{type(value).__name__} {value!r}"


# ----------------------------------------------------------------------------------
# From Inductor IR (codegen time)


def _divisibility(value: int) -> int:
    return math.gcd(value, GPU_ALIGN_BYTES) if value else GPU_ALIGN_BYTES


def _dim(expr: Any, symbolic: bool, fresh_name: str, static_values: tuple[int, ...]) -> Dim:
    """One size or stride: static int, or a Sym named after Inductor's expression.
    Under ``symbolic``, only ``static_values`` stay static: strides 0 (broadcast) and 1
    (the unit-stride mode); a size of 1 becomes a runtime value like any other, so that
    M = 1 runs the binary every M runs (a static extent of 1 compiles a different
    kernel, and the GEMM's one faulted on the H200)."""
    from torch._inductor.virtualized import V

    sizevars = V.graph.sizevars
    if isinstance(expr, int) or getattr(expr, "is_Integer", False):
        value = int(expr)
        if not symbolic or value in static_values:
            return value
        return Sym(fresh_name, _divisibility(value))
    divisibility = 1
    for candidate in (16, 8, 4, 2):
        if sizevars.statically_known_multiple_of(expr, candidate):
            divisibility = candidate
            break
    return Sym(str(expr), divisibility)


def is_aligned(node: Any) -> bool:
    """Inductor guarantees 16-byte alignment for its buffers and for graph inputs not in
    ``unaligned_buffers`` (it copies those when misaligned); views add their offset."""
    from torch._inductor.virtualized import V

    offset_bytes = node.get_layout().offset * node.get_dtype().itemsize
    if not V.graph.sizevars.statically_known_true(offset_bytes % GPU_ALIGN_BYTES == 0):
        return False
    return node.get_name() not in V.graph.unaligned_buffers


def tensor_spec(node: Any, *, symbolic: bool, index: int) -> TensorSpec:
    """The spec of one IR node (buffer, view or layout owner).

    ``symbolic=True`` makes every size and non-trivial stride a runtime value, so one
    binary serves all shapes with the same divisibility; otherwise only the sizes that
    Inductor itself keeps symbolic (dynamic shapes) are runtime values.
    """
    dtype = node.get_dtype()
    shape = tuple(
        _dim(s, symbolic, f"a{index}_size{d}", (0,)) for d, s in enumerate(node.get_size())
    )
    stride = tuple(
        _dim(s, symbolic, f"a{index}_stride{d}", (0, 1))
        for d, s in enumerate(node.get_stride())
    )
    align = GPU_ALIGN_BYTES if is_aligned(node) else dtype.itemsize
    return TensorSpec(str(dtype).removeprefix("torch."), shape, stride, align)


def specs_for_nodes(nodes: list[Any], symbolic: bool) -> list[ArgSpec]:
    """One spec per entry argument: tensors from their IR node, a workspace from its
    record, size variables as ints."""
    return [
        node.spec() if isinstance(node, Workspace)
        else tensor_spec(node, symbolic=symbolic, index=index) if hasattr(node, "get_size")
        else ScalarSpec()
        for index, node in enumerate(nodes)
    ]


# ----------------------------------------------------------------------------------
# To CuTe DSL fake arguments (compile time)


def fake_arguments(specs: Sequence[ArgSpec]) -> list[Any]:
    """CuTe DSL placeholders for ``cute.compile``; equal Sym names share one SymInt."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor


    symbols: dict[tuple[str, bool], Any] = {}

    def resolve(dim: Dim, wide: bool) -> Any:
        if isinstance(dim, int):
            return dim
        if (dim.name, wide) not in symbols:
            make = cute.sym_int64 if wide else cute.sym_int32
            symbols[dim.name, wide] = make(divisibility=dim.divisibility)
        return symbols[dim.name, wide]

    fakes: list[Any] = []
    for spec in specs:
        if isinstance(spec, ScalarSpec):
            fakes.append(cutlass.Int64(0) if spec.dtype == "int64" else cutlass.Int32(0))
            continue
        fakes.append(
            make_fake_tensor(
                cutlass_dtype(spec.torch_dtype),
                tuple(resolve(d, wide=False) for d in spec.shape),
                tuple(resolve(d, wide=True) for d in spec.stride),
                assumed_align=spec.align,
            )
        )
    return fakes


def mismatch(specs: Sequence[ArgSpec], args: tuple[Any, ...]) -> str | None:
    """Why ``args`` do not fit ``specs`` (first problem found), or None if they do."""
    if len(args) != len(specs):
        return f"{len(args)} arguments for {len(specs)} parameters"
    for index, (spec, value) in enumerate(zip(specs, args)):
        if isinstance(spec, ScalarSpec):
            if not isinstance(value, int):
                return f"argument {index}: expected an int, got {describe_value(value)}"
            continue
        if not isinstance(value, torch.Tensor):
            return f"argument {index}: expected a tensor, got {describe_value(value)}"
        problem = _tensor_mismatch(spec, value)
        if problem:
            return f"argument {index}: {problem}"
    return None


def _tensor_mismatch(spec: TensorSpec, value: torch.Tensor) -> str | None:
    static = spec.static_layout
    if (static is not None and value.is_cuda and value.dtype == static[0]
            and value.shape == static[1] and value.stride() == static[2]
            and not value.data_ptr() % spec.align):
        return None  # every check below passes: a launch's common case, in one comparison
    if value.dtype != spec.torch_dtype:
        return f"dtype {value.dtype}, expected {spec.dtype}"
    if value.device.type != "cuda":
        return f"device {value.device}, expected a CUDA tensor"
    if value.dim() != len(spec.shape):
        return f"rank {value.dim()}, expected {len(spec.shape)}"
    for what, want, have in (("size", spec.shape, value.shape), ("stride", spec.stride, value.stride())):
        for dim, (w, h) in enumerate(zip(want, have)):
            if isinstance(w, int) and w != h:
                return f"{what}[{dim}] is {h}, expected {w}"
            if isinstance(w, Sym) and h % w.divisibility:
                return f"{what}[{dim}] is {h}, expected a multiple of {w.divisibility}"
    if value.data_ptr() % spec.align:
        return f"data pointer not {spec.align}-byte aligned"
    return None
