"""Tuning decisions that Inductor does not persist -- which of a few of our kernels won a
retiming in interleaved rounds (``autotune/retime.py``) -- kept as kernels are: in the
local cache (``<root>/decisions/<key>.json``, sealed under its secret), in the remote
tier, and in torch.compile's cache artifacts, so that a warm machine times nothing.

A decision's key (``decision_key``) hashes what its caller says decides it (the
candidates' binaries, the sizes they ran at, the GPU and its software) with this
package's toolchain versions; its value is JSON (not None). ``lookup`` reads the local
file, else fetches the remote entry (verified, then stored locally); ``save`` writes the
file and publishes it. A caller takes a value only where it names one of its own
candidates: a decision can pick among them, never bring another kernel in.

Failure semantics: no OSError escapes. A fault is one warning per kind (through the disk
cache's ``fault``) and the decision is made again; a file that does not verify (damaged,
edited, another key's) is passed by with a warning and replaced by the next ``save``.
Files are written atomically; the last of two writers of one key wins, either verifies.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from typing import Any

from ... import counters
from .. import versions
from .cache_files import Folder
from .disk_cache import KernelDiskCache, default_cache
from .integrity import check_seal, seal
from .portable import record_artifact
from .remote_cache import default_tier

log = logging.getLogger(__name__)

FOLDER = "decisions"
FORMAT = 1
# the names the store owns in its folder: decisions, and their temp files while written
_NAME = re.compile(r"[0-9a-f]{64}\.json|\.[0-9a-f]{64}\.json\.[0-9a-f]{16}\.tmp")


def decision_key(kind: str, material: Any) -> str:
    text = json.dumps({"kind": kind, "material": material, "versions": versions.toolchain_versions()},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def lookup(key: str) -> Any | None:
    """The decision stored for ``key`` locally or remotely, or None."""
    start = time.perf_counter()
    try:
        return _lookup(key)
    finally:
        counters.decisions.add(lookup_s=time.perf_counter() - start)


def _lookup(key: str) -> Any | None:
    value = _read(key)
    if value is not None:
        counters.decisions.add(local_hits=1)
    else:
        tier = default_tier()
        fetched = tier.fetch("decision", key) if tier is not None else None
        value = _value(fetched[1]) if fetched is not None else None
        if value is None:
            counters.decisions.add(misses=1)
            return None
        counters.decisions.add(remote_hits=1)
        _write(key, value)
    record_artifact("decision", key, _payload(value), {})
    return value


def save(key: str, value: Any) -> None:
    """Keep ``value`` for ``key`` locally and remotely, and in the cache artifacts."""
    _write(key, value)
    tier = default_tier()
    if tier is not None:
        tier.publish("decision", key, _payload(value), {})
    record_artifact("decision", key, _payload(value), {})
    counters.decisions.add(saved=1)


def store_verified(key: str, payload: bytes) -> None:
    """Keep locally a decision verified elsewhere (a cache artifact's)."""
    value = _value(payload)
    if value is not None:
        _write(key, value)


def _payload(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True).encode()


def _value(payload: bytes) -> Any | None:
    try:
        return json.loads(payload)
    except ValueError:
        log.warning("a verified CuteDSL tuning decision is not JSON; not used")
        return None


def _folder(create: bool, cache: KernelDiskCache | None = None) -> Folder | None:
    """The store's folder in ``cache`` (default: the configured one), or None where the
    cache is off or it does not exist."""
    cache = cache or default_cache()
    if cache.mode.secret is None:
        return None
    with Folder.open_root(cache.root) as root:
        try:
            return root.child(FOLDER, create=create and cache.mode.writable)
        except FileNotFoundError:
            return None


def _read(key: str) -> Any | None:
    cache = default_cache()
    try:
        folder = _folder(create=False)
        if folder is None:
            return None
        with folder:
            data = folder.read(f"{key}.json")
    except FileNotFoundError:
        return None
    except OSError as err:
        cache.fault("read a tuning decision", err, "deciding it again")
        return None
    try:
        manifest = json.loads(data)
        valid = (isinstance(manifest, dict) and manifest.get("format") == FORMAT
                 and check_seal(cache.mode.secret, manifest) and manifest.get("key") == key)
    except ValueError:
        valid = False
    if not valid or manifest.get("value") is None:
        log.warning("ignoring unusable CuteDSL tuning decision %s in %s (damaged, edited or "
                    "another key's); deciding it again", key, cache.root / FOLDER)
        return None
    return manifest["value"]


def _write(key: str, value: Any) -> None:
    cache = default_cache()
    if not cache.mode.writable:
        return
    manifest = {"format": FORMAT, "key": key, "value": value, "created": time.time()}
    manifest["mac"] = seal(cache.mode.secret, manifest)
    try:
        folder = _folder(create=True)
        if folder is None:
            return
        with folder:
            folder.write_atomic(f"{key}.json", json.dumps(manifest, indent=1).encode())
    except OSError as err:
        cache.fault("store a tuning decision", err, "it is kept in memory only")


def entries() -> list[str]:
    """The keys of the stored decisions (verified or not); the cache is only looked at."""
    try:
        folder = _folder(create=False, cache=default_cache(create=False))
        if folder is None:
            return []
        with folder:
            return sorted(name[:64] for name in folder.names()
                          if _NAME.fullmatch(name) and name.endswith(".json"))
    except OSError:
        return []


def clear() -> tuple[int, list[str]]:
    """Remove every decision: how many, and the errors met."""
    removed, errors = 0, []
    try:
        folder = _folder(create=False)
    except OSError as err:
        return 0, [f"{default_cache().root / FOLDER}: {type(err).__name__}: {err}"]
    if folder is None:
        return 0, []
    with folder:
        for name in folder.names():
            if not _NAME.fullmatch(name):
                continue
            try:
                removed += folder.unlink_file(name) and name.endswith(".json")
            except OSError as err:
                errors.append(f"{folder.path / name}: {type(err).__name__}: {err}")
    return removed, errors
