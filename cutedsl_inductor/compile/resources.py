"""What a kernel asks of the GPU, read without one: the registers, shared memory and spills
of each kernel function a ``@cute.jit`` entry launches (``cutedsl-inductor check``).

``compile_with_resources`` compiles the entry afresh (a cached binary keeps no report)
with ptxas' report on (CuTe DSL's ``remarks{ptx}`` option; CuTe DSL prints the report to
stderr after a successful compile, and it is captured here) and reads two texts:

* ptxas' report, per kernel function: registers, barriers, the stack frame, the bytes of
  spill stores and loads, static shared memory;
* the host code CuTe DSL generated (the compiled module's LLVM IR), per launch: the
  dynamic shared memory it asks for (CuTe DSL computes it from the kernel's allocations and
  writes it as a constant into field 2 of the launch config, a
  ``struct<(array<3 x i32>, array<3 x i32>, i64, ptr, ptr, i32)>``: grid, block, bytes).

Both are CuTe DSL 4.8's output, not an API: a field a later version writes otherwise is
None ("unknown"), never a guess; ``tests/compile/test_resources.py`` pins both on real
compiles.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
from collections.abc import Callable, Sequence
from typing import Any

from .. import config
from .compiler import compile_uncached
from .records import KernelDescription
from .specs import ArgSpec

_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_SPILLS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:, used (\d+) barriers)?(?:, (\d+) bytes smem)?")
_LAUNCH_CONFIG = r"!llvm\.struct<\(array<3 x i32>, array<3 x i32>, i64, ptr, ptr, i32\)>"
_CONSTANT = re.compile(r"(%\w+) = llvm\.mlir\.constant\((\d+) : i64\)")
_SMEM_FIELD = re.compile(rf"(%\w+) = llvm\.getelementptr %\w+\[0, 2\] : .*{_LAUNCH_CONFIG}")
_STORE = re.compile(r"llvm\.store (%\w+), (%\w+) : i64")
_KERNEL = re.compile(r"llvm\.mlir\.addressof @kernels_(\w+)")


@dataclasses.dataclass(frozen=True)
class KernelResources:
    """One kernel function's needs; None where CuTe DSL's output did not say."""

    function: str
    registers: int | None
    barriers: int | None
    stack_bytes: int | None
    spill_store_bytes: int | None
    spill_load_bytes: int | None
    static_smem_bytes: int | None
    dynamic_smem_bytes: int | None

    @property
    def spills(self) -> bool | None:
        if self.spill_store_bytes is None or self.spill_load_bytes is None:
            return None
        return bool(self.spill_store_bytes or self.spill_load_bytes)


def ptxas_report(text: str) -> dict[str, dict[str, int | None]]:
    """{kernel function: its numbers} from ptxas' verbose report, as CuTe DSL prints it
    (in colour, and wrapped and indented inside its remark where a kernel spills)."""
    found: dict[str, dict[str, int | None]] = {}
    plain = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", text).split())
    parts = _ENTRY.split(plain)
    for function, body in zip(parts[1::2], parts[2::2]):
        spills, used = _SPILLS.search(body), _USED.search(body)
        numbers: dict[str, int | None] = dict.fromkeys(
            ("stack_bytes", "spill_store_bytes", "spill_load_bytes", "registers",
             "barriers", "static_smem_bytes"))
        if spills:
            numbers.update(zip(("stack_bytes", "spill_store_bytes", "spill_load_bytes"),
                               map(int, spills.groups())))
        if used:
            registers, barriers, smem = used.groups()
            numbers.update(registers=int(registers), barriers=int(barriers or 0),
                           static_smem_bytes=int(smem or 0))
        found[function] = numbers
    return found


def launch_smem(host_ir: str) -> dict[str, int]:
    """{kernel function: the dynamic shared memory its launch asks for} from the host
    code's LLVM IR, where a constant is stored into a launch config's byte field before
    the kernel's address is taken (one function at a time: SSA names are local)."""
    found: dict[str, int] = {}
    for function in host_ir.split("llvm.func ")[1:]:
        constants = dict((name, int(value)) for name, value in _CONSTANT.findall(function))
        fields: set[str] = set()
        pending: int | None = None
        for line in function.splitlines():
            if match := _SMEM_FIELD.search(line):
                fields.add(match.group(1))
            elif (match := _STORE.search(line)) and match.group(2) in fields:
                pending = constants.get(match.group(1))
            elif (match := _KERNEL.search(line)) and pending is not None:
                found[match.group(1)] = pending
                pending = None
    return found


def compile_with_resources(entry_fn: Callable[..., Any], specs: Sequence[ArgSpec], arch: str,
                           describe: KernelDescription) -> tuple[KernelResources, ...]:
    """Compile ``entry_fn`` at ``specs`` for ``arch`` (``compile_uncached``: its errors)
    and read each kernel function's needs."""
    report = io.StringIO()
    options = f"{config.compile_options} remarks{{ptx}}".strip()
    with config.patch(compile_options=options), contextlib.redirect_stderr(report):
        compiled = compile_uncached(entry_fn, specs, arch, describe)
    smem = launch_smem(str(compiled.ir_module))
    return tuple(KernelResources(function=function, dynamic_smem_bytes=smem.get(function),
                                 **numbers)
                 for function, numbers in ptxas_report(report.getvalue()).items())
