"""Kernels for Inductor's C++ wrapper (cpp_wrapper, AOTInductor): what C++ needs to launch
a compiled kernel without Python (docs/aot.md).

What is launched is the binary the autotuner timed: the shared library the disk cache
linked from the kernel's TVM-FFI object (``objects.link_library``). It exports
``__tvm_ffi_<symbol_for(key)>``, TVM-FFI's packed call (``int f(void* self, const
TVMFFIAny* args, int32_t n, TVMFFIAny* result)``), which takes each tensor as a
``DLTensor*`` and each size as an int64, reads its stream from TVM-FFI's environment
(``TVMFFIEnvGetStream``: the caller sets it) and needs two runtime libraries, by their
file names (their SONAMEs): CuTe DSL's (``libcute_dsl_runtime.so``, the flavor
``objects.runtime_libraries`` picks) and TVM-FFI's (``libtvm_ffi.so``).

``exported_kernel`` returns it, or raises ``NotExportableError`` naming why not: the disk
cache is off or holds no library for the key (no C compiler, no runtime library, a
read-only cache without the entry), or an argument's dtype has no DLPack code here.
``staged`` writes a file once under a content-addressed folder of Inductor's cache
(``<cache dir>/cutedsl_aot/<sha256[:16]>/<name>``), where the C++ wrapper names it and
AOTInductor's packager copies it from. Shipped files end in ``.cutedsl``: AOTInductor's
package loader takes a ``.so`` (or ``.o``) in the model folder for its own.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

from .. import config
from ..exc import NotExportableError
from .cache.disk_cache import default_cache
from .cache.objects import RUNTIME, runtime_libraries, symbol_for
from .specs import ArgSpec, ScalarSpec

SHIPPED_SUFFIX = ".cutedsl"
# torch dtype name -> DLPack (type code, bits): what TVM-FFI's decoder checks
DLPACK_DTYPES = {
    "bool": (6, 8), "uint8": (1, 8), "int8": (0, 8), "int16": (0, 16), "int32": (0, 32),
    "int64": (0, 64), "float16": (2, 16), "bfloat16": (4, 16), "float32": (2, 32),
    "float64": (2, 64),
}


@dataclasses.dataclass(frozen=True)
class ExportedKernel:
    key: str
    symbol: str  # the packed call's symbol in ``library``
    library: bytes

    @property
    def file_name(self) -> str:
        return f"{symbol_for(self.key)}{SHIPPED_SUFFIX}"


@dataclasses.dataclass(frozen=True)
class RuntimeLibrary:
    soname: str  # what a kernel library's DT_NEEDED names
    path: str  # where this process finds it

    @property
    def file_name(self) -> str:
        return f"{self.soname}{SHIPPED_SUFFIX}"


def exported_kernel(key: str, specs: Sequence[ArgSpec], *, kernel: str,
                    template: str | None) -> ExportedKernel:
    """The library of the kernel ``key`` (compiled and stored already), or
    ``NotExportableError``."""
    def refuse(reason: str) -> NotExportableError:
        return NotExportableError(kernel=kernel, template=template, reason=reason)

    dtypes = sorted({s.dtype for s in specs if not isinstance(s, ScalarSpec)} - set(DLPACK_DTYPES))
    if dtypes:
        raise refuse(f"no DLPack type code here for {', '.join(dtypes)}")
    if not config.disk_cache:
        raise refuse("the disk cache, which holds the exported libraries, is off "
                     "(cutedsl_inductor.config.disk_cache)")
    if runtime_libraries() is None:
        raise refuse(f"CuTe DSL's runtime library ({RUNTIME}) was not found")
    with default_cache().entry(key) as entry:
        library = entry.library()
    if library is None:
        raise refuse("the disk cache holds no shared library for it (one warning said why "
                     "none was linked, or the cache is read-only without its entry)")
    return ExportedKernel(key, f"__tvm_ffi_{symbol_for(key)}", library)


def runtime() -> tuple[RuntimeLibrary, ...]:
    """CuTe DSL's runtime library and TVM-FFI's, as kernel libraries need them."""
    libraries = runtime_libraries()
    if libraries is None:
        raise OSError(f"CuTe DSL's runtime library ({RUNTIME}) was not found")
    return tuple(RuntimeLibrary(Path(path).name, path) for path in libraries)


def staged(name: str, data: bytes) -> Path:
    """``data`` as ``name`` in its content-addressed folder (written once, atomically)."""
    from torch._inductor.codecache import write_atomic
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    folder = Path(cache_dir()) / "cutedsl_aot" / hashlib.sha256(data).hexdigest()[:16]
    path = folder / name
    if not path.is_file() or path.stat().st_size != len(data):
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_atomic(str(path), data, make_dirs=True)
    return path


def staged_runtime(library: RuntimeLibrary) -> Path:
    """A copy of a runtime library, to ship (its file changes with its version)."""
    info = os.stat(library.path)
    return _staged_file(library.path, library.file_name, info.st_size, info.st_mtime_ns)


@functools.cache
def _staged_file(path: str, name: str, size: int, mtime_ns: int) -> Path:
    return staged(name, Path(path).read_bytes())
