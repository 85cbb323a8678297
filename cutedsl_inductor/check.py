"""Check a template without a GPU: render each choice, compile it and report what each of
its kernels asks of the GPU (registers, shared memory, spills), or its error and the line
of the generated file it points to (``cutedsl-inductor check``; docs/templates.md).

``check_template`` makes one choice per parameter set on contiguous inputs of the given
shapes and dtype, on a virtual CUDA device of a scratch Inductor graph
(``autotune/scratch.py``), exactly as a lowering would (``CuteDSLTemplate.generate``), for
``arch``; each compiles in this process and from no cache (``compile/resources.py``), so
a check neither reads nor fills the kernel cache.

Failure semantics: a choice that fails to render or compile is a report with the error,
and the rest are still checked; only a target that names no template (``load_template``)
raises (``CheckTargetError``). A template whose entry is upstream-style (a plain Python
entry that compiles at its first launch, with real tensors) cannot be compiled here: its
report says so.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import itertools
import re
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch._inductor import ir

from . import config
from .autotune.scratch import scratch_graph
from .compile.compiler import entry_name, is_cute_jit
from .compile.records import Params
from .compile.resources import KernelResources, compile_with_resources
from .exc import CheckTargetError
from .runtime.loader import describe_kernel, import_source
from .template.template import CuteDSLTemplate


@dataclasses.dataclass(frozen=True)
class ChoiceReport:
    """One parameter set's outcome: its kernels' needs, or its error and where."""

    params: Params
    name: str | None = None  # the kernel's name, once rendered
    kernels: tuple[KernelResources, ...] = ()
    error: str | None = None
    where: str | None = None  # the generated file, and its line where the error names one

    def __str__(self) -> str:
        head = f"{self.name or '(not rendered)'} [{self.params}]"
        if self.error is not None:
            return f"FAILED {head}: {self.error}" + (f"\n  at {self.where}" if self.where else "")
        return "\n".join([head] + [f"  {_describe(kernel)}" for kernel in self.kernels])


def _bytes(value: int | None) -> str:
    return "?" if value is None else f"{value} B"


def _describe(kernel: KernelResources) -> str:
    spills = ("spills: ?" if kernel.spills is None else
              f"SPILLS {kernel.spill_store_bytes} B stored, {kernel.spill_load_bytes} B loaded"
              if kernel.spills else "no spills")
    return (f"{kernel.registers if kernel.registers is not None else '?'} registers, "
            f"shared memory {_bytes(kernel.dynamic_smem_bytes)} dynamic + "
            f"{_bytes(kernel.static_smem_bytes)} static, stack {_bytes(kernel.stack_bytes)}, "
            f"{spills}: {kernel.function}")


def load_template(target: str) -> CuteDSLTemplate:
    """The ``CuteDSLTemplate`` that ``FILE.py:NAME`` names (the file runs as a module)."""
    file, _, name = target.rpartition(":")
    path = Path(file)
    if not file or not name or path.suffix != ".py":
        raise CheckTargetError(target=target, cause="not of the form FILE.py:NAME")
    if not path.is_file():
        raise CheckTargetError(target=target, cause=f"no file {file}")
    spec = importlib.util.spec_from_file_location(f"cutedsl_check_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    template = getattr(module, name, None)
    if not isinstance(template, CuteDSLTemplate):
        raise CheckTargetError(target=target,
                               cause=f"{name} in {file} is {type(template).__name__}")
    return template


def check_template(template: CuteDSLTemplate, shapes: Sequence[Sequence[int]],
                   params: Sequence[Mapping[str, Any]] = ({},), *,
                   dtype: torch.dtype = torch.bfloat16, arch: str = "sm_90a",
                   output_shape: Sequence[int] | None = None) -> list[ChoiceReport]:
    """A report per parameter set of ``template`` on contiguous inputs of ``shapes`` (its
    ``def_kernel`` arguments, in order) and ``dtype``, its output ``output_shape`` (default:
    the first input's), compiled for ``arch``."""
    with config.patch(arch=arch, disk_cache=False), scratch_graph() as scratch:
        inputs = [scratch.input(shape, dtype) for shape in shapes]
        layout = ir.FixedLayout(torch.device("cuda", 0), dtype,
                                list(output_shape or shapes[0]))
        return [_check(template, inputs, layout, Params.of(choice), arch) for choice in params]


def _check(template: CuteDSLTemplate, inputs: list[Any], layout: Any,
           params: Params, arch: str) -> ChoiceReport:
    try:
        choice = template.generate(input_nodes=inputs, layout=layout, **params)
    except Exception as err:
        return ChoiceReport(params, error=_error(err), where=_where(err, None))
    module, path = import_source(choice.source)
    entry = getattr(module, entry_name(choice.name), None)
    if not is_cute_jit(entry):
        return ChoiceReport(params, choice.name, where=path, error=(
            f"its entry {entry_name(choice.name)} is not a @cute.jit function over "
            "def_kernel: an upstream-style entry compiles at its first launch, on a GPU"))
    describe = describe_kernel(choice.kernel, path)
    try:
        kernels = compile_with_resources(entry, choice.specs, arch, describe)
    except Exception as err:
        return ChoiceReport(params, choice.name, error=_error(err), where=_where(err, path))
    return ChoiceReport(params, choice.name, kernels)


def _error(err: BaseException) -> str:
    """The error's type and message, without CuTe DSL's terminal colours."""
    return re.sub(r"\x1b\[[0-9;]*m", "", f"{type(err).__name__}: {err}")


def _where(err: BaseException, path: str | None) -> str | None:
    """``path:line`` where the error (its message, its chain's tracebacks) points into the
    generated file; else the generated file."""
    path = path or getattr(err, "fields", {}).get("path")
    if path is None:
        return None
    chain: list[BaseException] = []
    cause: BaseException | None = err
    while cause is not None and cause not in chain:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    for link in chain:
        if match := re.search(re.escape(path) + r":(\d+)", str(link)):
            return f"{path}:{match.group(1)}"
        lines = [frame.lineno for frame in traceback.extract_tb(link.__traceback__)
                 if frame.filename == path]
        if lines:
            return f"{path}:{lines[-1]}"
    if match := re.search(r"at line (\d+)", str(err)):
        return f"{path}:{match.group(1)}"
    return path


# -- the command: ``cutedsl-inductor check FILE.py:NAME --shapes ...`` (its options: cli.py)


def main(args: argparse.Namespace) -> int:
    try:
        template = load_template(args.target)
    except CheckTargetError as err:
        print(f"cutedsl-inductor check: {err}")
        return 2
    names = [name for name, _ in args.param]
    combos = [dict(zip(names, values))
              for values in itertools.product(*(values for _, values in args.param))]
    reports = check_template(template, args.shapes, combos, dtype=getattr(torch, args.dtype),
                             arch=args.arch, output_shape=args.output_shape)
    for report in reports:
        print(report)
    failed = sum(report.error is not None for report in reports)
    print(f"{len(reports) - failed} of {len(reports)} choice(s) compiled for {args.arch}")
    return 1 if failed else 0
