"""On-disk cache of compiled kernels: TVM-FFI object files plus a JSON manifest each.

Layout: ``<root>/<key[:2]>/<key>.o`` (from ``export_to_c``), ``<key>.json`` (the
manifest: key, exported symbol, byte size and sha256 of the object, toolchain versions,
arch, kernel, template, parameters) and ``<key>.lock``. ``root`` is
``config.cache_dir`` (env ``CUTEDSL_INDUCTOR_CACHE_DIR``), else ``cutedsl/`` under
Inductor's cache dir.

Invariants: files are written to a temp name in the same folder and ``os.replace``d
into place, the object first and the manifest last, so an entry exists only once it is
complete. ``lock(key)`` (a file lock) serialises compiling one key across processes:
a second process waits, then loads what the first stored. ``load`` checks the
manifest's key and versions and the object's size and sha256 before loading it.

Failure semantics: a truncated, corrupt or foreign entry is removed (with a warning)
and ``load`` returns None, so the caller rebuilds it; a failing store only logs.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from filelock import FileLock

from .. import config
from ..exc import CacheEntryError

log = logging.getLogger(__name__)

MANIFEST_FORMAT = 1


def default_root() -> Path:
    if config.cache_dir:
        return Path(config.cache_dir)
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return Path(cache_dir()) / "cutedsl"


@functools.cache
def _cache_for(root: Path) -> "KernelDiskCache":
    return KernelDiskCache(root)


def default_cache() -> "KernelDiskCache":
    return _cache_for(default_root())


def symbol_for(key: str) -> str:
    return f"cutedsl_{key[:24]}"


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class KernelDiskCache:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        # loaded modules stay referenced: their functions point into them
        self._modules: dict[str, Any] = {}

    def paths(self, key: str) -> tuple[Path, Path, Path]:
        folder = self.root / key[:2]
        return folder / f"{key}.o", folder / f"{key}.json", folder / f"{key}.lock"

    def lock(self, key: str) -> FileLock:
        lock_path = self.paths(key)[2]
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        return FileLock(str(lock_path))

    # -- read ----------------------------------------------------------------------

    def has(self, key: str) -> bool:
        """Whether an entry for ``key`` is there (``load`` verifies it)."""
        return self.paths(key)[1].exists()

    def load(self, key: str) -> Any | None:
        """The cached function for ``key``, or None (missing, or removed as unusable)."""
        obj_path, manifest_path, _ = self.paths(key)
        if not manifest_path.exists():
            return None
        try:
            manifest = self._verified_manifest(key, obj_path, manifest_path)
            import cutlass.cute as cute

            module = cute.runtime.load_module(str(obj_path), enable_tvm_ffi=True)
            function = getattr(module, manifest["symbol"])
        except Exception as err:
            reason = err if isinstance(err, CacheEntryError) else repr(err)
            log.warning("removing unusable CuteDSL cache entry %s: %s", obj_path, reason)
            self.remove(key)
            return None
        self._modules[key] = module
        return function

    def _verified_manifest(self, key: str, obj_path: Path, manifest_path: Path) -> dict:
        from .compiler import toolchain_versions

        try:
            manifest = json.loads(manifest_path.read_text())
        except (OSError, ValueError) as err:
            raise CacheEntryError(path=manifest_path, reason=f"bad manifest: {err}") from err
        if manifest.get("format") != MANIFEST_FORMAT or manifest.get("key") != key:
            raise CacheEntryError(path=manifest_path, reason="foreign entry (key differs)")
        if manifest.get("versions") != toolchain_versions():
            raise CacheEntryError(path=manifest_path, reason="built by other versions")
        try:
            data = obj_path.read_bytes()
        except OSError as err:
            raise CacheEntryError(path=obj_path, reason=f"object missing: {err}") from err
        if len(data) != manifest.get("size"):
            raise CacheEntryError(
                path=obj_path, reason=f"truncated ({len(data)} of {manifest.get('size')} bytes)"
            )
        if hashlib.sha256(data).hexdigest() != manifest.get("sha256"):
            raise CacheEntryError(path=obj_path, reason="checksum mismatch")
        return manifest

    # -- write ---------------------------------------------------------------------

    def store(self, key: str, compiled: Any, describe: dict[str, Any]) -> None:
        """Export ``compiled`` (a TVM-FFI compiled function) under ``key``; hold
        ``lock(key)`` around the compile and this call."""
        from .compiler import toolchain_versions

        obj_path, manifest_path, _ = self.paths(key)
        symbol = symbol_for(key)
        try:
            obj_path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=obj_path.parent, suffix=".o")
            os.close(fd)
            try:
                compiled.export_to_c(tmp, function_name=symbol)
                data = Path(tmp).read_bytes()
                os.replace(tmp, obj_path)
            finally:
                Path(tmp).unlink(missing_ok=True)
            manifest = {
                "format": MANIFEST_FORMAT,
                "key": key,
                "symbol": symbol,
                "size": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
                "versions": toolchain_versions(),
                "created": time.time(),
                **{k: describe.get(k) for k in ("kernel", "template", "arch", "path", "signature")},
                "params": {k: repr(v) for k, v in describe.get("params", {}).items()},
            }
            _atomic_write(manifest_path, json.dumps(manifest, indent=1).encode())
        except Exception:
            log.warning("could not store CuteDSL kernel %s in %s", key, self.root,
                        exc_info=True)

    def remove(self, key: str) -> None:
        obj_path, manifest_path, _ = self.paths(key)
        manifest_path.unlink(missing_ok=True)
        obj_path.unlink(missing_ok=True)

    # -- maintenance ---------------------------------------------------------------

    def entries(self) -> list[dict[str, Any]]:
        found = []
        for manifest_path in sorted(self.root.glob("*/*.json")):
            try:
                found.append(json.loads(manifest_path.read_text()))
            except (OSError, ValueError):
                found.append({"key": manifest_path.stem, "corrupt": True})
        return found

    def clear(self) -> int:
        """Remove every entry; returns how many manifests were removed."""
        removed = 0
        for path in sorted(self.root.glob("*/*")):
            if path.suffix in (".o", ".json", ".tmp"):
                removed += path.suffix == ".json"
                path.unlink(missing_ok=True)
        return removed
