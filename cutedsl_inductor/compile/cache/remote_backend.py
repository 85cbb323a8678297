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


# a read in one round trip that sends no byte of a value over the bound (ARGV[1]): the
# value, nil where there is none, or the length of one over the bound. A script without
# flags reads on a full server and on a replica as GET does.
GET_BOUNDED = """
local size = redis.call('STRLEN', KEYS[1])
if size > tonumber(ARGV[1]) then return size end
return redis.call('GET', KEYS[1])
"""


class RedisBackend(RemoteCacheBackend[bytes]):
    """Bytes in Redis under a client with timeouts; a value over ``limit`` bytes is not
    read at all."""

    def __init__(self, client: Any, limit: int) -> None:
        super().__init__()
        self.client = client
        self.limit = limit

    def _get(self, key: str) -> bytes | None:
        reply = self.client.eval(GET_BOUNDED, 1, key, self.limit)
        if isinstance(reply, int):
            raise OversizedValue(reply, self.limit)
        return reply or None  # no such key (or an empty value)

    def _put(self, key: str, data: bytes) -> None:
        self.client.set(key, data)


class CuteDSLRemoteCache(RemoteCache[bytes]):
    def __init__(self, backend: RedisBackend) -> None:
        super().__init__(backend, RemoteCachePassthroughSerde())

    def _get(self, key: str, sample: Any) -> bytes | None:
        return super()._get(redis_key(key), sample)

    def _put(self, key: str, value: bytes, sample: Any) -> None:
        super()._put(redis_key(key), value, sample)
