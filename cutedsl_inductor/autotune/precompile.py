"""Precompile: fill the kernel cache with template choices, on any machine, GPU or not.

Each built-in template module offers ``precompile_choices(scratch)``: the choices that
torch.compile would generate for representative inputs (symbolic shapes, so one binary
serves every size of a divisibility class). Their binaries, compiled for ``arch``, are
exported to the disk cache; a GPU machine that shares (or receives a copy of) the
cache directory then loads them without compiling. Keys include arch and toolchain
versions, so the two machines must run the same nvidia-cutlass-dsl / apache-tvm-ffi /
cutedsl_inductor versions.

Choices compile in ``config.compile_workers`` worker processes where there are any.

Failure semantics: a choice that fails to compile is counted and reported, and the
rest go on; the summary says what failed and why.
"""

from __future__ import annotations

import dataclasses
import importlib
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .. import config
from ..compile.workers import already_built
from .scratch import scratch_graph

# short name -> module offering ``precompile_choices(scratch)``
BUILTIN_TEMPLATES = {
    "elementwise": "cutedsl_inductor.templates.elementwise",
    "gemm": "cutedsl_inductor.templates.gemm.template",
}


@dataclasses.dataclass
class PrecompileSummary:
    compiled: int = 0
    cached: int = 0
    failed: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    def __str__(self) -> str:
        lines = [
            f"precompiled {self.compiled} kernel(s), {self.cached} already cached, "
            f"{len(self.failed)} failed, in {self.seconds:.1f} s"
        ]
        lines += [f"  FAILED {name}: {reason}" for name, reason in self.failed]
        return "\n".join(lines)


def precompile(arch: str, templates: tuple[str, ...] = tuple(BUILTIN_TEMPLATES),
               gemm_shapes: list[tuple[int, int, int]] | None = None,
               progress: bool = True) -> PrecompileSummary:
    """Compile the choices of ``templates`` for ``arch`` into the disk cache; the GEMM's
    for each (M, N, K) of ``gemm_shapes`` (default: one representative shape)."""
    from tqdm import tqdm

    summary = PrecompileSummary()
    start = time.perf_counter()
    with config.patch(arch=arch, disk_cache=True), scratch_graph() as scratch:
        choices: list[Any] = []
        for name in templates:
            module = importlib.import_module(BUILTIN_TEMPLATES[name])
            if name == "gemm" and gemm_shapes:
                choices += module.precompile_choices(scratch, gemm_shapes)
            else:
                choices += module.precompile_choices(scratch)
        with ThreadPoolExecutor(max(1, config.compile_workers)) as pool:
            built = pool.map(_build, choices)
            for choice, (was_built, error) in tqdm(zip(choices, built), total=len(choices),
                                                   desc=f"precompile {arch}", unit="kernel",
                                                   disable=not progress):
                if error is not None:
                    summary.failed.append((choice.name, f"{type(error).__name__}: {error}"))
                elif was_built:
                    summary.cached += 1
                else:
                    summary.compiled += 1
    summary.seconds = time.perf_counter() - start
    return summary


def _build(choice: Any) -> tuple[bool, Exception | None]:
    """(was it in the cache already, the error if it failed); compiles in a worker
    process where there are any, as under Inductor."""
    was_built = already_built(choice.bmreq)
    choice.precompile()
    return was_built, choice.failure
