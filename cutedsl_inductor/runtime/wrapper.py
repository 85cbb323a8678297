"""CuteDSLKernelWrapper: what Inductor's output code calls, ``kernel.run(*args, stream=s)``.

Three launch paths:
- ``TVMFFIKernelWrapper`` (the entry is a ``@cute.jit`` function, compiled once with
  TVM-FFI): ``run`` hands the torch tensors straight to the compiled function, which
  launches on the current torch stream and itself checks dtype, rank, static sizes and
  strides and device. The Python cost per call is one attribute lookup and one call.
- ``CuteDSLKernelWrapper`` (an upstream-style plain Python entry): ``run`` checks the
  arguments against the specs, then calls the entry with the stream.
- ``InductorEntryWrapper`` (the same entry, loaded by Inductor's output code, every spec
  static): ``run`` calls the entry without the check. Inductor lays out what it passes
  as the specs say (its guards fix the inputs' sizes and strides, it allocates the rest
  and copies inputs it assumed aligned that are not), as its own Triton launchers
  assume; a direct caller gets the checked wrapper.

Failure semantics: arguments that do not fit raise ``KernelArgumentError`` naming the
kernel, template, expected and actual arguments and the generated file.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..compile.specs import ArgSpec, describe_value, mismatch
from ..exc import KernelArgumentError


class CuteDSLKernelWrapper:
    def __init__(
        self,
        kernel_fn: Any,
        kernel_path: str | None = None,
        *,
        kernel_name: str = "",
        template: str | None = None,
        specs: Sequence[ArgSpec] | None = None,
        origin: str | None = None,
    ) -> None:
        self.kernel_fn = kernel_fn
        self.kernel_path = kernel_path
        self.kernel_name = kernel_name
        self.template = template
        self.specs = specs
        # where the binary came from: "compiled", "disk" or "memory" (``compile_entry``);
        # None for an upstream-style entry, which compiles in its first call
        self.origin = origin

    def run(self, *args: Any, stream: Any = None) -> Any:
        if self.specs is not None:
            problem = mismatch(self.specs, args)
            if problem:
                raise self.argument_error(args, problem)
        return self.kernel_fn(*args, stream=stream)

    def argument_error(self, args: tuple[Any, ...], cause: str) -> KernelArgumentError:
        expected = ", ".join(s.describe() for s in self.specs or [])
        return KernelArgumentError(
            kernel=self.kernel_name,
            template=self.template,
            expected=expected,
            got=", ".join(describe_value(a) for a in args),
            cause=cause,
            path=self.kernel_path,
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.kernel_name!r}, path={self.kernel_path!r})"


class TVMFFIKernelWrapper(CuteDSLKernelWrapper):
    def run(self, *args: Any, stream: Any = None) -> Any:
        try:
            return self.kernel_fn(*args)
        except (TypeError, ValueError) as err:
            cause = mismatch(self.specs or [], args) or f"{type(err).__name__}: {err}"
            raise self.argument_error(args, cause) from err


class InductorEntryWrapper(CuteDSLKernelWrapper):
    def run(self, *args: Any, stream: Any = None) -> Any:
        return self.kernel_fn(*args, stream=stream)
