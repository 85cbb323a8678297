"""The remote tier's Redis access as Inductor's remote-cache machinery: a ``RemoteCache``
(Inductor's controller, with its statistics and wait counters) with a pass-through
serde over a backend of ours (``remote_cache.py`` says why Inductor's own Redis backend
is not used). It imports Inductor, so ``remote_cache.py`` imports it only where the tier
is on: a compile worker's process, which otherwise imports no Inductor, pays for it only
then.

Failure semantics: a value over ``limit`` is ``OversizedValue``, refused unread; the
client's errors go to the caller (``RemoteTier``), which turns them into warnings.
"""

from __future__ import annotations

from typing import Any

from torch._inductor.remote_cache import (
    RemoteCache,
    RemoteCacheBackend,
    RemoteCachePassthroughSerde,
)

from .redis_names import OversizedValue, redis_key


class RedisBackend(RemoteCacheBackend[bytes]):
    """Bytes in Redis under a client with timeouts; a read takes at most ``limit`` bytes."""

    def __init__(self, client: Any, limit: int) -> None:
        super().__init__()
        self.client = client
        self.limit = limit

    def _get(self, key: str) -> bytes | None:
        # one round trip, no MULTI (which a full server refuses); a value replaced between
        # the two reads fails verification
        with self.client.pipeline(transaction=False) as pipe:
            size, data = pipe.strlen(key).getrange(key, 0, self.limit - 1).execute()
        if size == 0:
            return None  # no such key
        if size > self.limit:
            raise OversizedValue(size, self.limit)
        return data

    def _put(self, key: str, data: bytes) -> None:
        self.client.set(key, data)


class CuteDSLRemoteCache(RemoteCache[bytes]):
    def __init__(self, backend: RedisBackend) -> None:
        super().__init__(backend, RemoteCachePassthroughSerde())

    def _get(self, key: str, sample: Any) -> bytes | None:
        return super()._get(redis_key(key), sample)

    def _put(self, key: str, value: bytes, sample: Any) -> None:
        super()._put(redis_key(key), value, sample)
