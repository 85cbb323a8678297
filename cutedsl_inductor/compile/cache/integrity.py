"""Entry integrity: a per-cache secret and the keyed digest (HMAC-SHA256 under it) that
seals each entry's manifest, and with it the entry's key and its object's sha256.

The secret is ``SECRET_BYTES`` random bytes in ``<root>/secret``, created 0600 at first
use, complete from its first moment (``Folder.link_new``), so that processes starting
together agree on it. It is trusted only as a regular file of that size, owned by the
owner of the cache root and not writable by every user (a group-writable one is the
owner's choice, or a copy extracted under umask 002). Whoever can write entries but not
read the secret cannot make one that verifies: an object swapped for another entry's,
an edited object with its manifest edited to match, or an entry renamed to another key
all fail ``check_seal``. The loader then uses the very bytes that were checked.

Failure semantics: ``read_secret`` raises OSError for a secret it cannot read or trust
(PermissionError naming the reason for an untrusted one); returns None when there is
none and ``create`` is False.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import os
import secrets
import stat
from typing import Any

from .cache_files import Folder

SECRET_NAME = "secret"
SECRET_BYTES = 32


def read_secret(root: Folder, owner: int, create: bool) -> bytes | None:
    """The cache's secret (made now if there is none and ``create``)."""
    try:
        fd = root.open_file(SECRET_NAME)
    except FileNotFoundError:
        if not create:
            return None
        root.link_new(SECRET_NAME, secrets.token_bytes(SECRET_BYTES))  # or another's
        fd = root.open_file(SECRET_NAME)
    with open(fd, "rb") as f:
        info = os.fstat(fd)
        problem = _untrusted(info, owner)
        data = f.read(SECRET_BYTES + 1)
    if problem is None and len(data) != SECRET_BYTES:
        problem = f"it holds {len(data)} bytes, not {SECRET_BYTES}"
    if problem is not None:
        raise PermissionError(errno.EPERM, f"untrusted secret ({problem})",
                              str(root.path / SECRET_NAME))
    return data


def _untrusted(info: os.stat_result, owner: int) -> str | None:
    if info.st_uid != owner:
        return f"owned by uid {info.st_uid}, the cache by uid {owner}"
    if info.st_mode & stat.S_IWOTH:
        return f"writable by every user (mode {stat.filemode(info.st_mode)})"
    return None


def seal(secret: bytes, manifest: dict[str, Any]) -> str:
    """The keyed digest of ``manifest`` (every field but "mac")."""
    fields = {name: value for name, value in manifest.items() if name != "mac"}
    text = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(secret, text, hashlib.sha256).hexdigest()


def check_seal(secret: bytes, manifest: dict[str, Any]) -> bool:
    mac = manifest.get("mac")
    return isinstance(mac, str) and hmac.compare_digest(mac, seal(secret, manifest))


def file_problem(what: str, data: bytes, size: Any, digest: Any) -> str | None:
    """What is wrong with an entry's file ``data`` (its ``what``: "object", "library")
    against the size and sha256 its manifest records, or None."""
    if len(data) != size:
        return f"{what} truncated ({len(data)} of {size} bytes)"
    if hashlib.sha256(data).hexdigest() != digest:
        return f"{what} checksum mismatch"
    return None
