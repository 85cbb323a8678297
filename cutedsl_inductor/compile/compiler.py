"""Compile once: every kernel specialization is compiled at most once per process and,
with the disk cache on, once per machine (or once anywhere, with ``precompile``).

A specialization's key hashes everything that changes the binary: the module source
(which contains the template's parameters), the entry name, the argument specs, the
target arch, the compile options, the versions of nvidia-cutlass-dsl, apache-tvm-ffi
and this package, and a hash of this package's Python sources (generated modules import
its kernels, e.g. the GEMM's body in ``sm90_gemm.py``: an edit there must miss every
cache even where the version stays the same). With the disk cache on, a kernel it lacks
is looked up in the remote tier (``remote_cache.py``) before compiling, what is compiled
is stored and published there, and every kernel this process gets is recorded for
torch.compile's cache artifacts (``artifacts.py``). ``cached_kernel`` is what needs
neither the entry nor CuTe DSL (memory, the disk cache, then the remote tier, whose
objects are stored on disk with the library linked from them): a warm process, locally
or remotely, gets its kernels from it without running their source. ``compile_entry``
compiles a ``@cute.jit`` entry that none of them has with TVM-FFI (the stream comes from
the caller's current torch stream); the result takes torch tensors directly. Upstream-style
modules, whose plain Python entry calls a ``@cute.jit`` function itself, compile once per
argument signature in process (``upstream.py``).

Failure semantics: a CuTe compile error becomes ``KernelCompileError`` naming the
template, parameters and generated file; nothing is cached for it. An arch CuTe DSL
does not know, or compile options that set what the package sets itself (the arch,
TVM-FFI, the host target: an entry's label must be what it holds), are ``ConfigError``
before anything compiles (the arch is checked where it compiles: a process that only
loads cached kernels does not import CuTe DSL to check it, and no entry holds an arch
CuTe DSL does not know).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from .. import config, counters
from ..exc import ConfigError, KernelCompileError, format_params
from . import versions
from .cache.disk_cache import default_cache, manifest_fields
from .cache.objects import export_object
from .cache.portable import record_artifact
from .cache.remote_cache import default_tier
from .records import KernelDescription
from .specs import ArgSpec, fake_arguments, specs_key

log = logging.getLogger(__name__)

# key -> compiled callable; guarded by COMPILE_LOCK (CuTe's compiler is not re-entrant)
_COMPILED: dict[str, Any] = {}
COMPILE_LOCK = threading.RLock()


def entry_name(kernel_name: str) -> str:
    """The name of a kernel's entry point in its module (``config.entry_suffix``)."""
    return f"{kernel_name}_{config.entry_suffix}"


def target_arch() -> str:
    """``config.arch``, else the current GPU's (``sm_90a`` on Hopper), else sm_90a."""
    if config.arch:
        return config.arch
    import torch

    if torch.cuda.is_available():
        return gpu_arch(*torch.cuda.get_device_capability())
    return "sm_90a"


def gpu_arch(major: int, minor: int) -> str:
    """The arch a process compiles for on a GPU of compute capability (major, minor):
    from Hopper on, with its arch-specific features (``sm_90a``)."""
    return f"sm_{major}{minor}{'a' if major >= 9 else ''}"


@functools.cache
def cute_archs() -> tuple[str, ...]:
    """The arch names CuTe DSL compiles for."""
    from cutlass.base_dsl import Arch

    return tuple(Arch.__members__)


def check_cute_arch(arch: str, variable: str) -> str:
    if arch not in cute_archs():
        raise ConfigError(variable=variable, value=arch,
                          accepted=f"an arch CuTe DSL compiles for: {', '.join(cute_archs())}")
    return arch


def compile_key(source: str, entry: str, specs: Sequence[ArgSpec], arch: str) -> str:
    material = {
        "source": hashlib.sha256(source.encode()).hexdigest(),
        "entry": entry,
        "specs": specs_key(specs),
        "arch": arch,
        "options": config.compile_options,
        "versions": versions.toolchain_versions(),
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def is_cute_jit(fn: Any) -> bool:
    return callable(fn) and getattr(fn, "_decorator_kind", None) == "jit"


def compile_options(arch: str, tvm_ffi: bool) -> str:
    check_cute_arch(arch, "cutedsl_inductor.config.arch")
    options = f"--gpu-arch {arch}"
    if tvm_ffi:
        options += " --enable-tvm-ffi"
    return f"{options} {config.compile_options}".strip()


def compile_entry(
    entry_fn: Callable[..., Any],
    specs: Sequence[ArgSpec],
    *,
    key: str,
    arch: str,
    describe: KernelDescription,
) -> tuple[Any, str]:
    """The compiled TVM-FFI function for ``entry_fn`` at ``specs`` and where it came
    from: "memory" (this process had it), "disk" (the disk cache) or "compiled".

    ``describe`` goes into errors and cache manifests.
    """
    compiled = _COMPILED.get(key)
    if compiled is not None:
        counters.kernels.add(memory_hits=1)
        return compiled, "memory"
    with COMPILE_LOCK:
        compiled = _COMPILED.get(key)
        if compiled is not None:
            return compiled, "memory"
        if not config.disk_cache:
            compiled, origin = compile_uncached(entry_fn, specs, arch, describe), "compiled"
        else:
            compiled, origin = _through_caches(entry_fn, specs, key, arch, describe)
        _COMPILED[key] = compiled = plain_ffi_function(compiled)
        return compiled, origin


def cached_kernel(key: str, describe: KernelDescription) -> tuple[Any, str] | None:
    """The function of ``key`` and where it came from, where this process ("memory"),
    the disk cache ("disk") or the remote tier ("remote": stored on disk under
    ``describe``'s manifest fields) has it; else None, and nothing compiled."""
    compiled = _COMPILED.get(key)
    if compiled is not None:
        counters.kernels.add(memory_hits=1)
        return compiled, "memory"
    if not config.disk_cache:
        return None
    with COMPILE_LOCK:
        compiled = _COMPILED.get(key)
        if compiled is not None:
            return compiled, "memory"
        with default_cache().entry(key) as entry:
            loaded, origin = _from_disk(entry, key), "disk"
            function = loaded and loaded.function
            if function is None:
                counters.kernels.add(disk_misses=1)
                function, origin = _from_remote(entry, key, describe), "remote"
        if function is None:
            return None
        _COMPILED[key] = function
        return function, origin


def publish_stored(key: str) -> None:
    """Publish ``key``'s kernel, which a compile worker stored in the disk cache, to the
    remote tier (workers never talk to it), loading it here, where the choice's load
    then finds it."""
    tier = default_tier()
    if tier is None:
        return
    with COMPILE_LOCK, default_cache().entry(key) as entry:
        loaded = _from_disk(entry, key)
        if loaded is None:
            return
        _COMPILED.setdefault(key, loaded.function)
    tier.publish("kernel", key, loaded.data, loaded.fields)


def _from_disk(entry: Any, key: str) -> Any:
    """What ``entry`` holds (``disk_cache.Loaded``; recorded for the cache artifacts), or
    None."""
    start = time.perf_counter()
    loaded = entry.load()
    if loaded is None:
        return None
    counters.kernels.add(disk_hits=1, disk_load_s=time.perf_counter() - start)
    record_artifact("kernel", key, loaded.data, loaded.fields)
    return loaded


def _from_remote(entry: Any, key: str, describe: KernelDescription) -> Any:
    """The function of ``key``'s entry in the remote tier, stored in ``entry`` (recorded
    for the cache artifacts), or None: no tier, no entry, or one that does not load."""
    tier = default_tier()
    start = time.perf_counter()
    fetched = tier.fetch("kernel", key) if tier is not None else None
    fetched_at = time.perf_counter()
    counters.kernels.add(remote_fetch_s=fetched_at - start)
    if fetched is None:
        return None
    fields = manifest_fields(describe)
    try:
        function = entry.adopt(fetched[1], fields)
    except Exception as err:  # verified, yet it does not load: compile instead
        log.warning("CuteDSL kernel %s from the remote cache does not load (%s: %s); "
                    "compiling it", describe.kernel, type(err).__name__, err)
        return None
    finally:
        counters.kernels.add(remote_adopt_s=time.perf_counter() - fetched_at)
    counters.kernels.add(remote_hits=1)
    record_artifact("kernel", key, fetched[1], fields)
    return function


def _through_caches(entry_fn: Callable[..., Any], specs: Sequence[ArgSpec], key: str, arch: str,
                    describe: KernelDescription) -> tuple[Any, str]:
    """From the disk cache (an entry stored since ``cached_kernel`` looked in it and in
    the remote tier), else compiled (stored and published); each recorded for
    torch.compile's cache artifacts."""
    fields = manifest_fields(describe.at(arch))
    with default_cache().entry(key) as entry:
        loaded = _from_disk(entry, key)
        if loaded is not None:
            return loaded.function, "disk"
        compiled = compile_uncached(entry_fn, specs, arch, describe)
        data = export_object(compiled, key)
        if data is not None:
            entry.store(data, fields)
            tier = default_tier()
            if tier is not None:
                tier.publish("kernel", key, data, fields)
            record_artifact("kernel", key, data, fields)
        return compiled, "compiled"


def plain_ffi_function(compiled: Any) -> Any:
    """The bare ``tvm_ffi.Function`` inside a compiled function (it keeps the code
    alive): calling it skips CuTe's Python keyword-argument wrapper, which costs
    microseconds per launch. Disk-cache loads are bare functions already."""
    unwrap = getattr(compiled, "__tvm_ffi_object__", None)
    plain = unwrap() if unwrap is not None else None
    return plain if plain is not None else compiled


def compile_error(describe: KernelDescription, arch: str, err: Exception
                  ) -> KernelCompileError:
    return KernelCompileError(
        kernel=describe.kernel,
        template=describe.template,
        params=format_params(describe.params),
        arch=arch,
        cause=f"{type(err).__name__}: {err}",
        path=describe.path,
    )


def compile_uncached(
    entry_fn: Callable[..., Any], specs: Sequence[ArgSpec], arch: str,
    describe: KernelDescription,
) -> Any:
    """CuTe DSL's compiled function for ``entry_fn`` at ``specs``, from no cache (its
    ``ir_module`` is the lowered module: ``resources.py`` reads it)."""
    import cutlass.cute as cute
    from cutlass.runtime import make_fake_stream

    options = compile_options(arch, True)
    args = [*fake_arguments(specs), make_fake_stream(use_tvm_ffi_env_stream=True)]
    start = time.perf_counter()
    try:
        compiled = cute.compile(entry_fn, *args, options=options)
    except Exception as err:
        raise compile_error(describe, arch, err) from err
    seconds = time.perf_counter() - start
    counters.kernels.add(compiled=1, compile_s=seconds)
    log.info("compiled CuteDSL kernel %s for %s in %.2f s", describe.kernel, arch, seconds)
    return compiled
