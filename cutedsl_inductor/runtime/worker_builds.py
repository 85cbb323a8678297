"""What the compile workers are asked for (``workers.py`` holds the pool that asks): a
choice's benchmark request as a worker's ``Build``, and its kernel key where a worker
could build it. Nothing here holds state: a request's knobs are patched into this
process's config only around what reads them, and only where they differ (an empty patch
writes nothing)."""

from __future__ import annotations

import re
from typing import Any

from .. import config
from ..compile import compiler
from ..compile.cache.disk_cache import default_cache, default_root
from ..compile.compiler import entry_name
from .loader import kernel_key, source_file
from .zygote import Build


def build_for(request: Any) -> Build:
    """``request`` as a worker's ``Build`` (called under its knobs): its source written
    here, its cache folder resolved, the remote tier off."""
    return Build(request.kernel,
                 request.knobs | {"cache_dir": str(default_root()), "remote_cache": False},
                 source_file(request.kernel.source)[1])


def changed(knobs: dict[str, Any]) -> dict[str, Any]:
    """Those of ``knobs`` that differ from this process's now."""
    return {name: value for name, value in knobs.items() if getattr(config, name) != value}


def buildable_key(request: Any, background: bool) -> str | None:
    """``request``'s kernel key where a worker could build it (workers configured, a disk
    cache, an entry that compiles when loaded, ``key_to_build``); else None. Whether the
    workers can start here is the pool's to say."""
    if (config.compile_workers < 1 or not config.disk_cache
            or not _compiles_when_loaded(request)):
        return None
    return key_to_build(request, background)


def key_to_build(request: Any, background: bool) -> str | None:
    """``request``'s kernel key where what a worker stores would reach this process: the
    disk cache takes it (it is writable) and the kernel is neither compiled here nor
    there yet; else None. For a ``background`` request whose knobs are no longer this
    process's (``config.patch`` from that thread could restore stale globals under
    another thread's feet): None, it is dropped."""
    knobs = changed(request.knobs)
    if knobs and background:
        return None
    with config.patch(**knobs):
        cache = default_cache()
        key = kernel_key(request.kernel)
        usable = cache.mode.writable and key not in compiler._COMPILED and not cache.has(key)
    return key if usable else None


def _compiles_when_loaded(request: Any) -> bool:
    """A ``@cute.jit`` entry compiles when loaded; an upstream-style entry compiles in
    its first call, here (nothing a worker could do ahead)."""
    return re.search(rf"@cute\.jit\s*\ndef {entry_name(request.kernel_name)}\(",
                     request.kernel.source) is not None
