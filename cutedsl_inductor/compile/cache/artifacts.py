"""Our kernels and tuning decisions in torch.compile's portable cache artifacts
(``torch.compiler.save_cache_artifacts()`` / ``load_cache_artifacts()``).

Every cache records what it made or used in this process with Inductor's
``CacheArtifactManager``, and ``save_cache_artifacts`` serializes it all.
``portable.record_artifact`` adds
each kernel this process compiled or loaded (from either tier) and each tuning decision it
made or reused, as a portable entry (``portable.py``: verified on arrival; sealed under
the fleet secret where one is configured). ``load_cache_artifacts`` calls each artifact's
``populate_cache``: ours verifies the entry and stores it in the local disk cache (a
kernel) or the decision store, so that the compile that follows loads instead of
compiling: a fresh machine compiles no CuTe kernel.

torch reads an artifact only through the class registered for its type
(``CacheArtifactFactory``); importing cutedsl_inductor registers ours. A process that
loads artifacts without having imported it cannot read ours, and torch then drops the
whole load -- every cache's artifacts, not only ours -- with one warning ("Failed to
un-pickle cache artifacts") whose cause is "Artifact of type=<ARTIFACT_TYPE> not
registered": the type's name says what to do.

Failure semantics: ``populate_cache`` never raises (torch would stop populating the
artifacts after ours): an entry that does not verify, or cannot be stored, is one warning
and is skipped; the kernel then compiles, the decision is made again.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from torch.compiler._cache import CacheArtifact, CacheArtifactFactory

from ...exc import PortableEntryError
from . import decisions
from .disk_cache import MANIFEST_FIELDS, default_cache
from .portable import ARTIFACT_TYPE, fleet_secret, unpack

log = logging.getLogger(__name__)

_KEY = re.compile(r"[0-9a-f]{64}")


@CacheArtifactFactory.register
class CuteDSLCacheArtifact(CacheArtifact):
    """One kernel or tuning decision: ``key`` its cache key, ``content`` its portable
    entry."""

    def populate_cache(self) -> None:
        try:
            if not _KEY.fullmatch(self.key):
                raise PortableEntryError(source="cache artifact:", key=self.key,
                                         reason="not a cache key")
            header, payload = unpack(self.content, self.key, "cache artifact:",
                                     fleet_secret())
            _store(header, payload, self.key)
        except PortableEntryError as err:
            log.warning("%s; skipped", err)
        except OSError as err:  # the fleet secret, or the local cache
            log.warning("CuteDSL cache artifact %s skipped: %s: %s", self.key,
                        type(err).__name__, err)
        except Exception as err:
            log.warning("CuteDSL cache artifact %s could not be stored (%s: %s); skipped",
                        self.key, type(err).__name__, err)

    @staticmethod
    def type() -> str:
        return ARTIFACT_TYPE


def _store(header: dict[str, Any], payload: bytes, key: str) -> None:
    if header["kind"] == "decision":
        decisions.store_verified(key, payload)
        return
    with default_cache().entry(key) as entry:
        entry.store(payload, {name: header.get(name) for name in MANIFEST_FIELDS})
