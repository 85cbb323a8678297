"""A compiled kernel as an object file: TVM-FFI's export of a compiled function, named
after the kernel's cache key (``symbol_for``: an object never exports another key's
symbol), and its load, from a private copy of the very bytes the caller verified."""

from __future__ import annotations

import logging
from typing import Any

from .cache_files import private_dir

log = logging.getLogger(__name__)


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
    """(module, function) loaded from ``data``, through a private copy of it."""
    import cutlass.cute as cute

    with private_dir() as folder:
        path = folder / "kernel.o"
        with open(path, "xb") as f:
            f.write(data)
        module = cute.runtime.load_module(str(path), enable_tvm_ffi=True)
        return module, getattr(module, symbol)
