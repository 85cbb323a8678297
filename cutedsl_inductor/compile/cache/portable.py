"""Portable cache entries: the values that the remote tier (Redis) and torch.compile's
cache artifacts carry, each verified on arrival without trusting its carrier.

An entry is ``MAGIC``, a header (one line of JSON) and the payload (a kernel's TVM-FFI
object file, or a tuning decision's JSON). The header names the entry's kind and the key
it was made for, the payload's size and sha256, the toolchain versions
(``versions.toolchain_versions``), a kernel's manifest fields (kernel, template, arch,
params, signature) and, where the fleet has a secret, "mac": the HMAC of the header
under it.

Trust model. The local cache's secret never leaves its machine, so nothing a fleet shares
can carry a local seal. ``unpack`` checks what an entry says against what the caller asks
for: the kind and the key (a value stored under another key -- another kernel's, another
version's -- is refused), the versions (the key hashes them: a mismatch is another
version's entry in the wrong place), the size (at most ``MAX_PAYLOAD_BYTES``) and the
sha256. That catches every accident: a truncated or garbled value, keys mixed up, another
release's entries. A digest cannot prove that the object is what compiling the key's
source gives: whoever can write the Redis can publish a forged object with a matching
header. So without a fleet secret the tier trusts the writers of its Redis as Inductor's
own remote caches do (``TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE`` loads Python code from the
same server): give it a Redis that only the fleet can write. With
``config.remote_cache_secret_file`` (at least ``MIN_SECRET_BYTES`` bytes that every
machine of the fleet holds, as it holds the Redis password) every header is sealed under
that secret and only entries whose seal verifies are used: a writer without the secret
can delete or garble entries (machines then compile) but cannot get code loaded. An
accepted entry is sealed anew under the local cache's secret when stored locally, and
loaded from the very bytes that were checked.

Failure semantics: ``unpack`` raises ``PortableEntryError`` naming the reason;
``fleet_secret`` raises OSError for a secret file it cannot read or use.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
from pathlib import Path
from typing import Any

from ... import config
from ...exc import PortableEntryError
from .. import versions
from .integrity import check_seal, seal

MAGIC = b"cutedsl-inductor portable entry 1\n"
KINDS = ("kernel", "decision")
# torch.compile's cache artifacts of our entries (``artifacts.py`` reads them); the name
# says what a process that cannot read them must do
ARTIFACT_TYPE = "cutedsl_inductor (import cutedsl_inductor before load_cache_artifacts)"
MAX_HEADER_BYTES = 1 << 16
MAX_PAYLOAD_BYTES = 64 << 20  # kernel objects take tens of KB to a few MB
MAX_ENTRY_BYTES = len(MAGIC) + MAX_HEADER_BYTES + 1 + MAX_PAYLOAD_BYTES
MIN_SECRET_BYTES = 16


def fleet_secret() -> bytes | None:
    """The fleet's secret (``config.remote_cache_secret_file``, surrounding whitespace
    stripped), or None where none is configured."""
    if config.remote_cache_secret_file is None:
        return None
    return _read_secret(Path(config.remote_cache_secret_file))


@functools.cache
def _read_secret(path: Path) -> bytes:
    with open(path, "rb") as f:
        secret = f.read(1 << 16).strip()
    if len(secret) < MIN_SECRET_BYTES:
        raise OSError(errno.EINVAL, f"a fleet secret needs at least {MIN_SECRET_BYTES} "
                                    f"bytes, this one has {len(secret)}", str(path))
    return secret


def pack(kind: str, key: str, payload: bytes, fields: dict[str, Any],
         secret: bytes | None) -> bytes:
    """The portable entry of ``payload`` (sealed under ``secret`` where given)."""
    header = {**fields, "kind": kind, "key": key, "size": len(payload),
              "sha256": hashlib.sha256(payload).hexdigest(), "versions": versions.toolchain_versions()}
    if secret is not None:
        header["mac"] = seal(secret, header)
    return MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n" + payload


def unpack(blob: Any, key: str, source: str, secret: bytes | None,
           kind: str | None = None) -> tuple[dict[str, Any], bytes]:
    """(header, payload) of the entry ``blob`` if it verifies as ``key``'s (of ``kind``,
    where given); ``source`` names where it came from, in the error."""

    def refused(reason: str) -> PortableEntryError:
        return PortableEntryError(source=source, key=key, reason=reason)

    if not isinstance(blob, bytes) or not blob.startswith(MAGIC):
        raise refused("not a portable entry (garbage, or another format)")
    if len(blob) > MAX_ENTRY_BYTES:
        raise refused(f"{len(blob)} bytes, over the bound of {MAX_ENTRY_BYTES}")
    end = blob.find(b"\n", len(MAGIC), len(MAGIC) + MAX_HEADER_BYTES)
    try:
        header = json.loads(blob[len(MAGIC):end]) if end > 0 else None
    except ValueError:
        header = None
    if not isinstance(header, dict):
        raise refused("its header is not readable")
    payload = blob[end + 1:]
    _check(header, payload, key, kind, secret, refused)
    return header, payload


def _check(header: dict[str, Any], payload: bytes, key: str, kind: str | None,
           secret: bytes | None, refused: Any) -> None:
    if header.get("kind") not in KINDS or kind not in (None, header["kind"]):
        raise refused(f"of kind {header.get('kind')!r}, not {kind or ' or '.join(KINDS)!r}")
    if header.get("key") != key:
        raise refused("made for another key")
    if secret is not None and not check_seal(secret, header):
        raise refused("its seal does not verify under the fleet secret (unsealed, forged, "
                      "or sealed under another secret)")
    ours = versions.toolchain_versions()
    theirs = header.get("versions")
    if theirs != ours:
        differ = ([name for name in sorted(set(ours) | set(theirs))
                   if theirs.get(name) != ours.get(name)]
                  if isinstance(theirs, dict) else ["every version"])
        raise refused(f"made by another version (differs in: {', '.join(differ)})")
    if header.get("size") != len(payload):
        raise refused(f"truncated or padded ({len(payload)} of {header.get('size')} bytes)")
    if hashlib.sha256(payload).hexdigest() != header.get("sha256"):
        raise refused("checksum mismatch")


def record_artifact(kind: str, key: str, payload: bytes, fields: dict[str, Any]) -> None:
    """Add an entry to what ``torch.compiler.save_cache_artifacts()`` will carry."""
    # here, not at the top: ``cache info|clear`` import this module and answer without torch
    from torch.compiler._cache import CacheArtifactManager

    blob = pack(kind, key, payload, fields, _secret_or_none())
    CacheArtifactManager.record_artifact(ARTIFACT_TYPE, key, blob)


def _secret_or_none() -> bytes | None:
    """The fleet secret to seal with; None where there is none or it cannot be read (the
    remote tier says so): unsealed entries are refused where the loader has a secret."""
    try:
        return fleet_secret()
    except OSError:
        return None
