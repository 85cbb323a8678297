"""Precompile: fill the kernel cache with template choices, on any machine, GPU or not.

Each built-in template's module (``catalog.py``) offers ``precompile_choices(scratch)``:
the choices that torch.compile would generate for representative inputs (symbolic shapes, so one binary
serves every size of a divisibility class). Their binaries, compiled for ``arch``, are
exported to the disk cache; a GPU machine that shares (or receives a copy of) the
cache directory then loads them without compiling. Keys include arch and toolchain
versions, so the two machines must run the same nvidia-cutlass-dsl / apache-tvm-ffi /
cutedsl_inductor versions.

Choices compile in ``config.compile_workers`` worker processes where there are any.
The counts say what happened, not what was there before: a kernel counts as compiled
when this process or its worker compiled it (an entry that did not verify is rebuilt,
and counts), as from the local cache when it was loaded from disk, as from the remote
cache when the remote tier had it (``compile/cache/remote_cache.py``; then it is on disk too),
so processes precompiling one cache at once compile each kernel once between them (the
disk cache's lock) and their counts add up. What is compiled is published to the remote
tier where it is on: precompiling on one machine fills it for the fleet.

Failure semantics: a choice that fails to compile is counted and reported, and the
rest go on; the summary says what failed and why, and which template offered no choice
at all (for an arch its kernels do not support).
"""

from __future__ import annotations

import dataclasses
import importlib
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from . import config
from .autotune.scratch import scratch_graph
from .catalog import BUILTIN_TEMPLATES
from .runtime import workers

@dataclasses.dataclass
class PrecompileSummary:
    compiled: int = 0
    local: int = 0  # from the local (disk) cache
    remote: int = 0  # from the remote cache
    failed: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    offered: int = 0  # choices the templates offered
    # templates that offered no choice, each with the arch (a template offers none for
    # an arch its kernels do not support: the GEMM's need sm_90a)
    silent: list[tuple[str, str]] = dataclasses.field(default_factory=list)

    def __str__(self) -> str:
        total = self.compiled + self.local + self.remote + len(self.failed)
        lines = [
            f"precompiled {total} kernel(s) in {self.seconds:.1f} s: {self.compiled} "
            f"compiled, {self.local} from the local cache, {self.remote} from the remote "
            f"cache, {len(self.failed)} failed"
        ]
        lines += [f"  FAILED {name}: {reason}" for name, reason in self.failed]
        lines += [f"  NOTHING from {name}: it offers no choice for {arch} (an arch its kernels "
                  "do not support, or these shapes)" for name, arch in self.silent]
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
            template = BUILTIN_TEMPLATES[name]
            module = importlib.import_module(template.module)
            shapes = (gemm_shapes,) if template.takes_shapes and gemm_shapes else ()
            offered = module.precompile_choices(scratch, *shapes)
            if not offered:
                summary.silent.append((name, arch))
            choices += offered
        summary.offered = len(choices)
        with ThreadPoolExecutor(max(1, config.compile_workers)) as pool:
            built = pool.map(_build, choices)
            for choice, outcome in tqdm(zip(choices, built), total=len(choices),
                                        desc=f"precompile {arch}", unit="kernel",
                                        disable=not progress):
                if isinstance(outcome, Exception):
                    summary.failed.append((choice.name, f"{type(outcome).__name__}: {outcome}"))
                elif outcome == "compiled":
                    summary.compiled += 1
                elif outcome == "remote":
                    summary.remote += 1
                else:
                    summary.local += 1
    summary.seconds = time.perf_counter() - start
    return summary


def _build(choice: Any) -> str | Exception:
    """Where the choice's kernel came from ("compiled" here or in a worker process,
    "remote", "disk", "memory"), or the error; compiles in a worker where there are any, as
    under Inductor."""
    try:
        in_worker = workers.pool().build(choice.bmreq)
        here = choice.load().origin
    except Exception as err:
        return err
    return in_worker or here
