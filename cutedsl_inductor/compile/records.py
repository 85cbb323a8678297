"""Typed records of a kernel as it travels: from a template's choice to the loader, a
compile worker, Inductor's tuning subprocess, another rank and the output code.

* ``Params``: a template's parameters, a frozen, ordered ``Mapping`` (what a template
  author passes to Jinja stays a mapping at the edge and is wrapped once, where a choice
  is made). Equality is a dict's; it hashes where every value does. Its order is the
  author's: errors and cache manifests list the parameters in it.
* ``KernelSource``: a rendered kernel (name, source, argument specs, template,
  parameters): what ``runtime.loader.load`` builds, what a compile worker's ``Build``
  and Inductor's benchmark request carry across processes.
* ``KernelDescription``: what errors and cache manifests say of a kernel (name,
  template, parameters, generated file, signature and, where it is compiled, the arch).

Invariants: every record is frozen and pickles. None is itself a key: compile keys hash
the source, entry name, specs and knobs (``compiler.compile_key``), kernel names the
rendered text and specs (``template/kernel.py``), and a manifest holds the fields the
dictionary it replaced held (``cache.disk_cache.manifest_fields``), so no key changed
with them. Failure semantics: a field of the wrong kind is ``RecordError`` naming the
record and the field, at construction.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ..exc import RecordError, format_params
from .specs import ArgSpec, ScalarSpec, TensorSpec


@dataclasses.dataclass(frozen=True, eq=False)
class Params(Mapping[str, Any]):
    """A template's parameters, in the order they were given."""

    pairs: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        names = [name for name, _ in self.pairs]
        for name in names:
            if not (isinstance(name, str) and name.isidentifier()):
                raise RecordError(record="Params", field="name", value=name,
                                  reason="a parameter's name is a Python identifier (the "
                                         "template reads it as a Jinja variable)")
        if len(set(names)) != len(names):
            raise RecordError(record="Params", field="names", value=names,
                              reason="each parameter is named once")

    @staticmethod
    def of(params: Mapping[str, Any] | None) -> "Params":
        """``params`` wrapped (itself where it is one already)."""
        if isinstance(params, Params):
            return params
        return Params(tuple((params or {}).items()))

    def __getitem__(self, name: str) -> Any:
        for key, value in self.pairs:
            if key == name:
                return value
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return (name for name, _ in self.pairs)

    def __len__(self) -> int:
        return len(self.pairs)

    def __hash__(self) -> int:  # as equality: a dict's, whatever the order
        return hash(frozenset(self.pairs))

    def __str__(self) -> str:
        return format_params(self)


@dataclasses.dataclass(frozen=True)
class KernelDescription:
    """What errors and cache manifests say of a kernel."""

    kernel: str
    template: str | None
    params: Params
    path: str | None  # the generated file
    signature: str  # its arguments, each spec's ``describe()``
    arch: str | None = None  # where it is compiled or cached for one

    def at(self, arch: str) -> "KernelDescription":
        return dataclasses.replace(self, arch=arch)


@dataclasses.dataclass(frozen=True)
class KernelSource:
    """A rendered kernel: its entry is ``<name>_<config.entry_suffix>`` in ``source``,
    compiled for ``specs``."""

    name: str
    source: str
    specs: tuple[ArgSpec, ...]
    template: str | None = None
    params: Params = Params()

    def __post_init__(self) -> None:
        if not isinstance(self.specs, tuple):
            raise RecordError(record="KernelSource", field="specs", value=type(self.specs),
                              reason="a tuple of argument specs (KernelSource.of takes any "
                                     "sequence)")
        for spec in self.specs:
            if not isinstance(spec, (TensorSpec, ScalarSpec)):
                raise RecordError(record="KernelSource", field="specs", value=spec,
                                  reason="each is a TensorSpec or a ScalarSpec")
        if not isinstance(self.params, Params):
            raise RecordError(record="KernelSource", field="params", value=self.params,
                              reason="a Params (KernelSource.of wraps a mapping)")

    @staticmethod
    def of(name: str, source: str, specs: Sequence[ArgSpec], template: str | None = None,
           params: Mapping[str, Any] | None = None) -> "KernelSource":
        return KernelSource(name, source, tuple(specs), template, Params.of(params))

    def describe(self, path: str | None) -> KernelDescription:
        """Its description, its source written at ``path``."""
        return KernelDescription(self.name, self.template, self.params, path,
                                 ", ".join(spec.describe() for spec in self.specs))
