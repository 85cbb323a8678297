"""On-disk cache of compiled kernels: TVM-FFI object files and the shared libraries
linked from them, each entry with a sealed manifest.

Layout under ``root`` (``config.cache_dir``, env ``CUTEDSL_INDUCTOR_CACHE_DIR``, else
``cutedsl/`` under Inductor's cache dir): ``secret`` (``integrity.py``) and, per entry,
in ``<key[:2]>/``: ``<key>.o`` (``export_to_c``), ``<key>.so`` (``objects.link_library``;
absent where it could not be linked), ``<key>.json`` (the manifest: key, size and sha256
of the object and of the library, versions, arch, kernel, template, parameters, sealed
under the secret), ``<key>.lock`` and, while a write is under way,
``.<key>.<o|so|json>.<random>.tmp``. The cache owns those names and nothing else:
``clear`` removes exactly those (regular files, in real folders) and follows no symlink.

Invariants: an entry is written only under its lock, the object and library first and the
manifest last, each atomically, so an entry exists only once complete; a second process
wanting the same key waits on the lock, then loads what the first stored. ``load`` reads
the manifest, the object and the library once each, checks the seal, the key, and each
file's size and sha256, and loads those very bytes (from a private copy): the library
through TVM-FFI, without CuTe DSL; the object through CuTe DSL where the entry has no
library or its library does not load (one warning). The symbol is derived from the key.
``Entry.adopt`` links and loads an object verified elsewhere (``portable.py``: the
remote tier's) and stores it, sealed under this cache's secret. Folders are created
0700, files 0600.

A root that holds names the cache does not own (``$HOME``, ``/``) is said in one warning
when first used. A cache opened only to be looked at (``default_cache(create=False)``:
``cache info``) creates neither its root nor its secret, and warns of its mode only there.

Modes, decided at first use and, unless read-write, said in one warning: read-write;
read-only when the root belongs to another user or is not writable (entries load where
they verify; nothing is locked, written or removed); off when the root is no usable
folder or its secret is untrusted, or missing from a read-only root (nothing there can
be verified): kernels compile in memory.

Failure semantics: no OSError escapes. A fault (open, lock, read, load, write, remove)
is one warning per kind, and the kernel still comes: loaded where it verifies, else
compiled (and kept in memory only when it cannot be stored). A damaged, forged or
foreign entry is rebuilt (removed first, under its lock).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import getpass
import hashlib
import json
import logging
import os
import re
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from ... import config
from ...exc import CacheEntryError
from .. import versions
from . import cache_inventory
from .cache_files import Folder, make_dirs
from .integrity import check_seal, file_problem, read_secret, seal
from .objects import link_library, load_library, load_object, symbol_for

if TYPE_CHECKING:  # ``cache info|clear`` read this module, and must not import torch
    from ..records import KernelDescription

log = logging.getLogger(__name__)

MANIFEST_FORMAT = 3
# what a manifest says about its kernel, besides the key, size, digest and versions
MANIFEST_FIELDS = ("kernel", "template", "arch", "path", "signature", "params")
_KEY = re.compile(r"[0-9a-f]{64}")


def default_root() -> Path:
    if config.cache_dir:
        return Path(config.cache_dir)
    return Path(inductor_cache_dir()) / "cutedsl"


def inductor_cache_dir() -> str:
    """Inductor's cache folder (its ``cache_dir()``), named as Inductor names it where torch
    is not imported (``cache info|clear`` answer without it): its variable, else
    ``torchinductor_<user>`` in the temp folder (tests/compile/cache/test_disk_cache.py pins the
    two equal)."""
    if "torch" in sys.modules:
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        return cache_dir()
    named = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if named is not None:
        return os.path.abspath(named)
    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        user = f"uid_{os.getuid()}"
    user = re.sub(r'[\\/:*?"<>|]', "_", user)
    return os.path.join(tempfile.gettempdir(), f"torchinductor_{user}")


@functools.cache
def _cache_for(root: Path) -> "KernelDiskCache":
    return KernelDiskCache(root)


def default_cache(create: bool = True) -> "KernelDiskCache":
    """The configured cache; ``create=False``: a view of it made now, to be looked at
    (``cache info``), which creates nothing."""
    return _cache_for(default_root()) if create else KernelDiskCache(default_root(), False)


@dataclasses.dataclass(frozen=True)
class Mode:
    writable: bool
    secret: bytes | None  # None: the cache is off
    note: str | None  # why it is not read-write


def _describe(err: Exception) -> str:
    return f"{type(err).__name__}: {err}"


class KernelDiskCache:
    def __init__(self, root: Path, create: bool = True) -> None:
        self.root = Path(root)
        self.create = create  # the root and its secret, where missing and writable
        # loaded modules stay referenced: their functions point into them
        self._modules: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._mode: Mode | None = None
        self._warned: set[str] = set()

    @property
    def mode(self) -> Mode:
        with self._lock:
            if self._mode is None:
                self._mode = self._open()
                if self._mode.note is not None and self.create:
                    log.warning("CuteDSL kernel cache %s %s", self.root, self._mode.note)
            return self._mode

    def _open(self) -> Mode:
        try:
            if self.create:
                make_dirs(self.root)
            info = os.stat(self.root)
        except FileNotFoundError:
            return Mode(False, None, "does not exist (yet)")
        except OSError as err:
            return Mode(False, None, f"cannot be used ({_describe(err)}); kernels compile "
                                     "in memory")
        if not stat.S_ISDIR(info.st_mode):
            return Mode(False, None, "is not a folder; kernels compile in memory")
        mine = info.st_uid == os.getuid()
        writable = mine and os.access(self.root, os.W_OK | os.X_OK)
        note = None if writable else (
            f"belongs to uid {info.st_uid}, not to this user" if not mine else "is not writable")
        try:
            with Folder.open_root(self.root) as root:
                self._warn_of_others(root)
                secret = read_secret(root, info.st_uid, create=writable and self.create)
        except OSError as err:
            return Mode(False, None, f"cannot be used: its secret: {_describe(err)}; kernels "
                                     "compile in memory")
        if secret is None and note is None:  # looked at only: nothing stored there yet
            return Mode(False, None, "has no secret: nothing was stored there yet")
        if secret is None:
            return Mode(False, None, f"{note} and has no secret, so its entries cannot be "
                                     "verified; kernels compile in memory")
        if note is not None:
            note += ": used read-only (entries load where they verify; nothing is stored)"
        return Mode(writable, secret, note)

    def _warn_of_others(self, root: Folder) -> None:
        """One warning where the root holds what the cache does not name (a home folder,
        ``/``): the cache will add its files beside them."""
        others = cache_inventory.foreign_names(root)
        if others:
            shown = ", ".join(repr(name) for name in others[:3])
            log.warning("CuteDSL kernel cache %s holds %d name(s) that are not the cache's "
                        "(%s%s): is it the folder meant? A kernel cache wants a folder of its "
                        "own (CUTEDSL_INDUCTOR_CACHE_DIR)", self.root, len(others), shown,
                        ", ..." if len(others) > 3 else "")

    def fault(self, action: str, err: Exception, consequence: str) -> None:
        """One warning per kind of fault; the rest at debug level."""
        with self._lock:
            first = action not in self._warned
            self._warned.add(action)
        log.log(logging.WARNING if first else logging.DEBUG,
                "CuteDSL kernel cache %s: could not %s (%s); %s", self.root, action,
                _describe(err), consequence)

    # -- one entry -----------------------------------------------------------------

    @contextlib.contextmanager
    def entry(self, key: str) -> Iterator["Entry"]:
        """The entry of ``key``, locked where the cache is writable (see ``Entry``)."""
        if not _KEY.fullmatch(key):
            raise ValueError(f"not a cache key: {key!r}")
        mode = self.mode
        with contextlib.ExitStack() as stack:
            folder = lock = None
            if mode.secret is not None:
                try:
                    root = stack.enter_context(Folder.open_root(self.root))
                    folder = stack.enter_context(root.child(key[:2], create=mode.writable))
                except FileNotFoundError:
                    pass  # read-only, and no such entry
                except OSError as err:
                    self.fault("open the entry folder", err, "compiling without the cache")
            if folder is not None and mode.writable:
                try:
                    lock = folder.lock(f"{key}.lock")
                except OSError as err:
                    self.fault("lock an entry", err, "compiling without the lock; nothing is "
                                                     "stored")
                else:
                    stack.callback(os.close, lock)
            yield Entry(self, key, folder, held=lock is not None)

    def has(self, key: str) -> bool:
        """Whether an entry for ``key`` is there (``Entry.load`` verifies it)."""
        if self.mode.secret is None:
            return False
        try:
            manifest = os.stat(self.root / key[:2] / f"{key}.json", follow_symlinks=False)
        except OSError:
            return False
        return stat.S_ISREG(manifest.st_mode)

    # -- maintenance (``cache_inventory.py``) ---------------------------------------

    def entries(self, digests: bool = False) -> list[dict[str, Any]]:
        """The manifest of each entry, with "verified" (its seal and key check out) or
        "corrupt", and "disk_bytes" (what its files take); with ``digests``, "damaged"
        (``cache_inventory.entries``)."""
        return cache_inventory.entries(self.root, self.mode.secret, digests)

    def clear(self) -> cache_inventory.ClearResult:
        """Remove every entry not being written right now (its lock held)."""
        return cache_inventory.clear(self.root)


@dataclasses.dataclass
class Entry:
    """One key's entry: ``folder`` None where the cache has none to offer; ``held``
    whether this process holds its lock (and so may write or remove it)."""

    cache: KernelDiskCache
    key: str
    folder: Folder | None
    held: bool

    def load(self) -> Loaded | None:
        """The cached function and the object it was loaded from, or None (missing,
        unreadable or unusable)."""
        if self.folder is None:
            return None
        try:
            manifest = self.folder.read(f"{self.key}.json")
        except FileNotFoundError:
            return None
        except OSError as err:
            self.cache.fault("read an entry", err, "compiling it")
            return None
        try:
            fields, data, library = self._check(manifest)
            module, function = self._load(data, library)
        except OSError as err:
            self.cache.fault("read an entry", err, "compiling it")
            return None
        except Exception as err:
            reason = err if isinstance(err, CacheEntryError) else repr(err)
            what = "removing" if self.held else "ignoring"
            log.warning("%s unusable CuteDSL cache entry %s: %s", what,
                        self.folder.path / f"{self.key}.o", reason)
            if self.held:
                self.remove()
            return None
        self.cache._modules[self.key] = module
        return Loaded(function, data, fields)

    def library(self) -> bytes | None:
        """The entry's shared library, verified as ``load`` verifies it but not loaded;
        None where the entry, or its library, is missing or does not verify."""
        if self.folder is None:
            return None
        try:
            return self._check(self.folder.read(f"{self.key}.json"))[2]
        except (OSError, CacheEntryError):
            return None

    def _check(self, manifest_bytes: bytes) -> tuple[dict[str, Any], bytes, bytes | None]:
        """(the manifest's fields (``manifest_fields``), the object, the library or
        None) if the entry verifies."""
        path = self.folder.path / f"{self.key}.json"

        def unusable(reason: str) -> CacheEntryError:
            return CacheEntryError(path=path, reason=reason)

        def verified(name: str, what: str, size: Any, digest: Any) -> bytes:
            try:
                data = self.folder.read(name)
            except FileNotFoundError:
                raise unusable(f"{what} missing") from None
            problem = file_problem(what, data, size, digest)
            if problem is not None:
                raise unusable(problem)
            return data

        try:
            manifest = json.loads(manifest_bytes)
        except ValueError as err:
            raise unusable(f"bad manifest: {err}") from err
        if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
            raise unusable(f"not a manifest of format {MANIFEST_FORMAT}")
        if not check_seal(self.cache.mode.secret, manifest):
            raise unusable("its seal does not verify (not written by this cache, or edited)")
        if manifest.get("key") != self.key:
            raise unusable("foreign entry (key differs)")
        data = verified(f"{self.key}.o", "object", manifest.get("size"), manifest.get("sha256"))
        library = None
        if manifest.get("library_sha256") is not None:
            library = verified(f"{self.key}.so", "library", manifest.get("library_size"),
                               manifest.get("library_sha256"))
        return {name: manifest.get(name) for name in MANIFEST_FIELDS}, data, library

    def _load(self, data: bytes, library: bytes | None) -> tuple[Any, Any]:
        """(module, function) from the verified library, else from the object."""
        symbol = symbol_for(self.key)
        if library is not None:
            try:
                return load_library(library, symbol)
            except Exception as err:
                self.cache.fault("load a kernel's shared library", err,
                                 "loading its object through CuTe DSL")
        return load_object(data, symbol)

    def adopt(self, data: bytes, fields: dict[str, Any]) -> Any:
        """Load the function from ``data`` (an object verified elsewhere: the remote
        tier's), then store it here; raises what loading raises."""
        library = link_library(data)
        module, function = self._load(data, library)
        self.cache._modules[self.key] = module
        if self.held:
            self._write(data, library, fields)
        return function

    def store(self, data: bytes, fields: dict[str, Any]) -> None:
        """Store the object ``data`` here, with the library linked from it and its
        manifest, if the lock is held."""
        if self.held:
            self._write(data, link_library(data), fields)

    def _write(self, data: bytes, library: bytes | None, fields: dict[str, Any]) -> None:
        manifest = {
            "format": MANIFEST_FORMAT,
            "key": self.key,
            "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "library_size": None if library is None else len(library),
            "library_sha256": None if library is None else hashlib.sha256(library).hexdigest(),
            "versions": versions.toolchain_versions(),
            "created": time.time(),
            **{name: fields.get(name) for name in MANIFEST_FIELDS},
        }
        manifest["mac"] = seal(self.cache.mode.secret, manifest)
        try:
            self.folder.write_atomic(f"{self.key}.o", data)
            if library is None:
                self.folder.unlink_file(f"{self.key}.so")  # an older entry's
            else:
                self.folder.write_atomic(f"{self.key}.so", library)
            self.folder.write_atomic(f"{self.key}.json", json.dumps(manifest, indent=1).encode())
        except OSError as err:
            self.cache.fault("store a kernel", err, "it is kept in memory only")

    def remove(self) -> None:
        try:
            self.folder.unlink_file(f"{self.key}.json")  # the entry ends with its manifest
            self.folder.unlink_file(f"{self.key}.o")
            self.folder.unlink_file(f"{self.key}.so")
        except OSError as err:
            self.cache.fault("remove an entry", err, "it is left in place")


class Loaded(NamedTuple):
    function: Any
    data: bytes  # the object file it was loaded from
    fields: dict[str, Any]  # its manifest's MANIFEST_FIELDS


def manifest_fields(describe: KernelDescription) -> dict[str, Any]:
    """The manifest fields of the kernel ``describe`` describes (the parameters as their
    reprs)."""
    fields = {name: getattr(describe, name) for name in MANIFEST_FIELDS}
    fields["params"] = {k: repr(v) for k, v in describe.params.items()}
    return fields
