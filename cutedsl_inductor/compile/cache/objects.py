"""A compiled kernel as an object file, and as a shared library linked from it.

``export_object``: TVM-FFI's export of a compiled function, exporting ``symbol_for(key)``
(an object never exports another key's symbol). ``link_library``: that object linked,
once, when its cache entry is written, into a shared library by the system's C compiler
driver (``cc -shared``), which needs CuTe DSL's runtime library and TVM-FFI's by SONAME,
leaves no symbol undefined and binds every one at load (``-z now``), so a library that
cannot run fails to load instead of failing at its first launch.

Two loads, each from a private copy of the very bytes the caller verified:
``load_library`` (``tvm_ffi.load_module``; no ``import cutlass``, which costs about a
second: a warm process's kernels load without CuTe DSL) after loading the runtime
libraries CuTe DSL itself would pick (``runtime_libraries``), and ``load_object``
(``cute.runtime.load_module``: CuTe DSL's in-process JIT linker), for an entry without a
library or whose library does not load.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import logging
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from .cache_files import private_dir

log = logging.getLogger(__name__)

RUNTIME = "libcute_dsl_runtime.so"
# CuTe DSL's compiler extension, one per CUDA toolkit flavor (cu12, cu13)
_FLAVOR = re.compile(r"_cutlass_ir\.cu(\d+)\..*\.so")
# runtime libraries loaded for kernel libraries (their DT_NEEDED resolve to these)
_PRELOADED: dict[str, ctypes.CDLL] = {}


def symbol_for(key: str) -> str:
    return f"cutedsl_{key[:24]}"


def export_object(compiled: Any, key: str) -> bytes | None:
    """``compiled`` (a TVM-FFI compiled function) as an object file exporting
    ``symbol_for(key)``; None, with a warning, where it cannot be exported."""
    try:
        with private_dir() as folder:
            compiled.export_to_c(str(folder / "kernel.o"), function_name=symbol_for(key))
            return (folder / "kernel.o").read_bytes()
    except Exception:
        log.warning("could not export CuteDSL kernel %s; it is kept in memory only", key,
                    exc_info=True)
        return None


def load_object(data: bytes, symbol: str) -> tuple[Any, Any]:
    """(module, function) loaded from the object ``data`` through CuTe DSL."""
    import cutlass.cute as cute

    with private_dir() as folder:
        path = folder / "kernel.o"
        with open(path, "xb") as f:
            f.write(data)
        module = cute.runtime.load_module(str(path), enable_tvm_ffi=True)
        return module, getattr(module, symbol)


def load_library(data: bytes, symbol: str) -> tuple[Any, Any]:
    """(module, function) loaded from the shared library ``data`` through TVM-FFI."""
    import tvm_ffi

    libraries = runtime_libraries()
    if libraries is None:
        raise OSError(f"CuTe DSL's runtime library ({RUNTIME}) was not found")
    for path in libraries:
        if path not in _PRELOADED:
            _PRELOADED[path] = ctypes.CDLL(path)
    with private_dir() as folder:
        path = folder / "kernel.so"
        with open(path, "xb") as f:
            f.write(data)
        module = tvm_ffi.load_module(str(path))
        return module, module[symbol]


_WARNED: set[str] = set()


def _warn_once(cause: str, detail: str = "") -> None:
    if cause not in _WARNED:
        _WARNED.add(cause)
        log.warning("CuteDSL kernels are cached without a shared library (%s%s): a process "
                    "that loads them imports CuTe DSL", cause, detail)


def link_library(data: bytes) -> bytes | None:
    """The object ``data`` linked into a shared library; None, with one warning per
    process and cause, where it cannot be (no C compiler, no runtime library, a link
    error)."""
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    libraries = runtime_libraries()
    if compiler is None or libraries is None:
        _warn_once("no C compiler" if compiler is None else f"no {RUNTIME} found")
        return None
    with private_dir() as folder:
        (folder / "kernel.o").write_bytes(data)
        args = [compiler, "-shared", "-o", str(folder / "kernel.so"), str(folder / "kernel.o"),
                "-Wl,--no-undefined", "-Wl,-z,now"]
        for path in map(Path, libraries):
            args += [f"-L{path.parent}", f"-l:{path.name}"]
        try:
            subprocess.run(args, check=True, capture_output=True, text=True, timeout=120)
            return (folder / "kernel.so").read_bytes()
        except (OSError, subprocess.SubprocessError) as err:
            stderr = (getattr(err, "stderr", None) or "").strip()[-500:]
            _warn_once(f"{compiler} failed", f": {err} {stderr}".rstrip())
            return None


@functools.cache
def runtime_libraries() -> tuple[str, str] | None:
    """(CuTe DSL's runtime library, TVM-FFI's), as CuTe DSL picks them
    (``cutlass.runtime.find_runtime_libraries``) without importing it: the runtime in
    ``CUTE_DSL_LIBS``, else that of the toolkit flavor CuTe DSL loads (the newest the
    CUDA driver supports; without a driver the newest). None where there is none."""
    import tvm_ffi

    runtime = _cute_runtime()
    return None if runtime is None else (runtime, tvm_ffi.libinfo.find_libtvm_ffi())


def _cute_runtime() -> str | None:
    listed = os.environ.get("CUTE_DSL_LIBS")
    if listed:
        return next((p for p in listed.split(os.pathsep) if p.endswith(RUNTIME)), None)
    spec = importlib.util.find_spec("cutlass")
    if spec is None or not spec.submodule_search_locations:
        return None
    package = Path(spec.submodule_search_locations[0])
    try:
        names = os.listdir(package / "_mlir" / "_mlir_libs")
    except OSError:
        return None
    flavors = sorted({int(m[1]) for m in map(_FLAVOR.fullmatch, names) if m}, reverse=True)
    driver = _driver_major()
    usable = [n for n in flavors if driver is None or driver >= n]
    if not usable:
        return None
    # CuTe DSL's search (``find_libs_in_ancestors``): up from base_dsl/env_manager.py,
    # <ancestor>/lib, then <ancestor>/cu<N>/lib
    for ancestor in (package / "base_dsl" / "env_manager.py").resolve().parents:
        for folder in ("lib", f"cu{usable[0]}/lib"):
            if (ancestor / folder / RUNTIME).is_file():
                return str(ancestor / folder / RUNTIME)
    return None


def _driver_major() -> int | None:
    """The CUDA driver's major version, None where there is no driver."""
    try:
        version = ctypes.c_int(0)
        if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version)) == 0:
            return version.value // 1000
    except (OSError, AttributeError):
        pass
    return None
