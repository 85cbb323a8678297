"""load_kernel: from generated source to a launchable ``CuteDSLKernelWrapper``.

Inductor's output code calls ``load_kernel(name, source, specs, ...)`` once per kernel
when the output module is imported, which wraps them once as a ``KernelSource``
(``compile/records.py``); autotuning calls ``load`` with a choice's. CuTe DSL
reads its functions' source (``inspect``, through ``linecache``), so the source is
written to Inductor's code cache (``PyCodeCache``: a real ``.py`` file, named by its
hash, shown in errors). What runs is the source held here, never what the file holds:
the module is executed from that text under the file's name, and ``linecache`` is
given the same text for that name (an entry no file check evicts), so what CuTe reads
is what was rendered. A file that differs (edited, or another rendering of the same
stripped text) is written again, with a warning. One module per source per process.

The source of a kernel that this process or the disk cache has already
(``compiler.cached_kernel``, by its key: a hash of the source, entry name and specs) is
not run at all: only ``@cute.jit`` entries' binaries are cached, so it loads as one, and
a warm process neither runs the rendered sources nor imports what they import (CuTe DSL,
the GEMM's modules). Otherwise the module runs: a ``@cute.jit`` entry is compiled once
per specialization (the remote tier, then the compiler); a plain Python entry gets its
module's ``@cute.jit`` functions rebound, and with ``config.upstream_fast_path`` its
``from_dlpack`` too (``compile/upstream.py``: records of the torch tensors, launched
through TVM-FFI). Invariant: loading the same
(source, specs) twice in a process returns wrappers around the same compiled function. Failure semantics: a missing entry
point is ``GeneratedCodeError``; compile errors are ``KernelCompileError``.
``load_exported`` is the same kernel as Inductor's C++ wrapper launches it
(``compile/exported.py``), or ``NotExportableError``.
"""

from __future__ import annotations

import hashlib
import linecache
import logging
import sys
import time
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ..compile.compiler import (
    cached_kernel,
    compile_entry,
    compile_key,
    entry_name,
    is_cute_jit,
    target_arch,
)
from ..compile.exported import ExportedKernel, exported_kernel
from ..compile.records import KernelDescription, KernelSource
from ..compile.specs import ArgSpec, ScalarSpec
from .. import counters
from ..exc import GeneratedCodeError, NotExportableError, format_params
from .wrapper import CuteDSLKernelWrapper, InductorEntryWrapper, TVMFFIKernelWrapper

log = logging.getLogger(__name__)
# under "torch." so that TORCH_LOGS="kernel_code" reaches it (its handlers live there)
kernel_code_log = torch._logging.getArtifactLogger("torch._inductor.cutedsl_inductor", "kernel_code")


# sha256 of a source -> the module executed from it
_MODULES: dict[str, types.ModuleType] = {}


def write_source(source: str) -> tuple[str, str]:
    """(cache key, path) of ``source`` written as a ``.py`` file in Inductor's cache."""
    from torch._inductor.codecache import PyCodeCache

    return PyCodeCache.write(source)


def source_file(source: str) -> tuple[str, str]:
    """(cache key, path) of the ``.py`` file in Inductor's cache that holds ``source``
    (written again, with a warning, where it holds something else)."""
    from torch._inductor.codecache import write_atomic

    key, path = write_source(source)
    try:
        on_disk = Path(path).read_bytes()
    except FileNotFoundError:
        on_disk = None
    if on_disk != source.encode():
        if on_disk is not None:
            log.warning("generated CuteDSL source %s differs from the kernel's; writing it "
                        "again", path)
        write_atomic(path, source, make_dirs=True)
    return key, path


def import_source(source: str, path: str | None = None) -> tuple[types.ModuleType, str]:
    """(module, path): ``source`` executed as a module named after its file in
    Inductor's cache (see the module docstring), or after ``path``, where the requesting
    process wrote it (a compile worker's build, ``zygote.Build``)."""
    digest = hashlib.sha256(source.encode()).hexdigest()
    module = _MODULES.get(digest)
    if module is not None:
        return module, module.__file__
    key, path = source_file(source) if path is None else (Path(path).stem, path)
    linecache.cache[path] = (len(source), None, source.splitlines(keepends=True), path)
    module = types.ModuleType(f"cutedsl_inductor.generated.{key}")
    module.__file__ = path
    exec(compile(source, path, "exec", dont_inherit=True), module.__dict__)
    sys.modules[module.__name__] = module
    return _MODULES.setdefault(digest, module), path


def kernel_key(kernel: KernelSource) -> str:
    """The compile key of ``kernel``'s ``@cute.jit`` entry at its specs, for the target
    arch."""
    return compile_key(kernel.source, entry_name(kernel.name), kernel.specs, target_arch())


def load_kernel(kernel_name: str, source: str, specs: Sequence[ArgSpec], *,
                template: str | None = None, params: Mapping[str, Any] | None = None,
                inductor: bool = False) -> CuteDSLKernelWrapper:
    """``load`` as the output code calls it: the kernel's parts, written out as Python
    (``inductor/scheduling.py``'s ``kernel_definition``)."""
    return load(KernelSource.of(kernel_name, source, specs, template, params),
                inductor=inductor)


def load(kernel: KernelSource, *, path: str | None = None,
         inductor: bool = False) -> CuteDSLKernelWrapper:
    """``path``: where the source is written already (``import_source``); ``inductor``:
    the caller is Inductor's output code (an upstream-style entry with static specs is
    then launched unchecked: ``runtime/wrapper.py``)."""
    start = time.perf_counter()
    try:
        return _load(kernel, path, inductor)
    finally:
        counters.loads.add(calls=1, seconds=time.perf_counter() - start)


def load_exported(kernel: KernelSource) -> ExportedKernel:
    """The kernel as Inductor's C++ wrapper launches it (``compile/exported.py``), loaded
    or built first; ``NotExportableError`` where it cannot be."""
    wrapper = load(kernel)
    if not isinstance(wrapper, TVMFFIKernelWrapper):
        raise NotExportableError(
            kernel=kernel.name, template=kernel.template,
            reason="its entry is a plain Python function (an upstream-style module, launched "
                   "through CuTe's JitExecutor); only @cute.jit entries export")
    return exported_kernel(kernel_key(kernel), kernel.specs, kernel=kernel.name,
                           template=kernel.template)


def describe_kernel(kernel: KernelSource, path: str | None = None) -> KernelDescription:
    """What errors and cache manifests say of ``kernel`` (``compiler.compile_entry``),
    its source written at ``path`` (by default, where ``source_file`` writes it)."""
    return kernel.describe(path or source_file(kernel.source)[1])


def _load(kernel: KernelSource, path: str | None, inductor: bool) -> CuteDSLKernelWrapper:
    key = kernel_key(kernel)
    describe = describe_kernel(kernel, path)
    specs, template = kernel.specs, kernel.template
    cached = cached_kernel(key, describe.at(target_arch()))
    if cached is not None:
        kernel_code_log.info("CuteDSL kernel %s: %s", kernel.name, describe.path)
        return TVMFFIKernelWrapper(cached[0], describe.path, kernel_name=kernel.name,
                                   template=template, specs=specs, origin=cached[1])
    module, path = import_source(kernel.source, path)
    kernel_code_log.info("CuteDSL kernel %s: %s", kernel.name, path)
    name = entry_name(kernel.name)
    entry = getattr(module, name, None)
    if entry is None:
        available = sorted(n for n, v in vars(module).items()
                           if callable(v) and not n.startswith("_"))
        raise GeneratedCodeError(
            template=template,
            params=format_params(kernel.params),
            cause=f"no entry point {name!r}; callables: {available}",
            path=path,
        )
    arch = target_arch()
    if is_cute_jit(entry):
        compiled, origin = compile_entry(entry, specs, key=key, arch=arch, describe=describe)
        return TVMFFIKernelWrapper(
            compiled, path, kernel_name=kernel.name, template=template, specs=specs,
            origin=origin,
        )
    # imports CuTe DSL, which the module that just ran imported
    from ..compile import upstream

    upstream.adopt(module, arch, describe)
    static = all(isinstance(s, ScalarSpec) or s.static_layout is not None for s in specs)
    wrapper = InductorEntryWrapper if inductor and static else CuteDSLKernelWrapper
    return wrapper(entry, path, kernel_name=kernel.name, template=template, specs=specs)
