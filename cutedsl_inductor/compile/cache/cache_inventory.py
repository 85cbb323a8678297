"""What a kernel cache folder holds, for ``cache info`` and ``cache clear``: each entry's
manifest and the removal of entries.

It knows the cache's names (the layout in ``disk_cache.py``): entry folders named like
``key[:2]``, in them ``<key>.o|so|json|lock`` and the temp files of writes under way.
Everything goes through ``Folder`` (descriptors, no symlink followed), and only those
names are read or removed.

Failure semantics: listing never raises (a folder or file that cannot be read is
skipped; a manifest that does not parse is listed as "corrupt"; with digests checked, a
file that cannot be read is what damages its entry); ``clear`` leaves an
entry whose lock another process holds and collects each failure as one line.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .cache_files import Folder
from .integrity import check_seal, file_problem

_FOLDER = re.compile(r"[0-9a-f]{2}")
# what the root holds besides entry folders: the secret (and its temp file while made,
# ``Folder.link_new``), the tuning decisions' folder (``decisions.py``)
_ROOT_NAME = re.compile(r"secret|\.secret\.[0-9a-f]{16}\.tmp|decisions")
# the files of an entry, and its temp files while written (``Folder.write_atomic``)
_ENTRY_FILE = re.compile(r"(?P<key>[0-9a-f]{64})\.(o|so|json|lock)")
_TEMP_FILE = re.compile(r"\.(?P<key>[0-9a-f]{64})\.(o|so|json)\.[0-9a-f]{16}\.tmp")


@dataclasses.dataclass
class ClearResult:
    removed: int = 0  # entries (manifests) removed
    busy: int = 0  # entries being written by another process, left alone
    errors: list[str] = dataclasses.field(default_factory=list)


def _folders(root_path: Path) -> Iterator[Folder]:
    """The root's entry folders (real folders named like ``key[:2]``); none if the root
    is no folder."""
    try:
        root = Folder.open_root(root_path)
    except OSError:
        return
    with root:
        for name in sorted(root.names()):
            if not _FOLDER.fullmatch(name):
                continue
            try:
                folder = root.child(name)  # no symlink, no file
            except OSError:
                continue
            with folder:
                yield folder


def foreign_names(root: Folder) -> list[str]:
    """The names in the root that are not the cache's, sorted."""
    return sorted(name for name in root.names()
                  if not (_FOLDER.fullmatch(name) or _ROOT_NAME.fullmatch(name)))


def _keys(folder: Folder) -> dict[str, list[str]]:
    """key -> its file names in ``folder`` (entry files and temp files)."""
    keys: dict[str, list[str]] = {}
    for name in folder.names():
        match = _ENTRY_FILE.fullmatch(name) or _TEMP_FILE.fullmatch(name)
        if match and match["key"][:2] == folder.path.name:
            keys.setdefault(match["key"], []).append(name)
    return keys


def entries(root: Path, secret: bytes | None, digests: bool = False) -> list[dict[str, Any]]:
    """The manifest of each entry under ``root``, with "verified" (its seal under
    ``secret`` and its key check out) or "corrupt", and "disk_bytes" (what its files
    take). With ``digests``, a verified entry whose object or library is not what its
    manifest records (read and hashed) gets "damaged": what is wrong."""
    found = []
    for folder in _folders(root):
        for key, names in sorted(_keys(folder).items()):
            if not folder.is_file(f"{key}.json"):
                continue
            try:
                manifest = json.loads(folder.read(f"{key}.json"))
                manifest["verified"] = bool(secret and check_seal(secret, manifest)
                                            and manifest.get("key") == key)
            except FileNotFoundError:
                continue  # no entry (yet, or any more)
            except (OSError, ValueError, TypeError, AttributeError):
                manifest = {"corrupt": True}
            if digests and manifest.get("verified"):
                manifest["damaged"] = _damage(folder, key, manifest)
            size = sum(folder.file_size(name) for name in names)
            found.append({**manifest, "key": key, "disk_bytes": size})
    return found


def _damage(folder: Folder, key: str, manifest: dict[str, Any]) -> str | None:
    """What is wrong with a sealed entry's object or library, or None."""
    files = [("object", f"{key}.o", manifest.get("size"), manifest.get("sha256"))]
    if manifest.get("library_sha256") is not None:
        files.append(("library", f"{key}.so", manifest.get("library_size"),
                      manifest.get("library_sha256")))
    for what, name, size, digest in files:
        try:
            problem = file_problem(what, folder.read(name), size, digest)
        except FileNotFoundError:
            problem = f"{what} missing"
        except OSError as err:
            problem = f"{what} unreadable ({type(err).__name__}: {err})"
        if problem is not None:
            return problem
    return None


def clear(root: Path) -> ClearResult:
    """Remove every entry under ``root`` not being written right now (its lock held)."""
    result = ClearResult()
    for folder in _folders(root):
        for key, names in sorted(_keys(folder).items()):
            try:
                lock = folder.lock(f"{key}.lock", blocking=False)
                if lock is None:
                    result.busy += 1
                    continue
                try:
                    result.removed += folder.unlink_file(f"{key}.json")
                    for name in names:
                        if not name.endswith(".lock"):
                            folder.unlink_file(name)
                    folder.unlink_file(f"{key}.lock")  # waiters then lock anew
                finally:
                    os.close(lock)
            except OSError as err:
                result.errors.append(f"{folder.path / key}: {type(err).__name__}: {err}")
    return result
