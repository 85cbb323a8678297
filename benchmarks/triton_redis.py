"""Triton's own Redis cache backend for the fleet benchmark, where Triton 3.6's cannot start.

``triton.runtime.cache.RedisRemoteCacheBackend`` reads its host, port and key format from
``knobs.cache.redis``, which Triton 3.6 does not have (they are ``knobs.redis``): the
first kernel it would cache raises ``AttributeError``. This subclass reads them where
they are. Used by ``fleet_first_call.sh`` with ``TRITON_REMOTE=1``:

    TRITON_CACHE_MANAGER=triton.runtime.cache:RemoteCacheManager
    TRITON_REMOTE_CACHE_BACKEND=benchmarks.triton_redis:RedisBackend
    TRITON_REDIS_HOST=... TRITON_REDIS_PORT=...
"""

from __future__ import annotations

from triton import knobs
from triton.runtime.cache import RedisRemoteCacheBackend


class RedisBackend(RedisRemoteCacheBackend):
    def __init__(self, key: str) -> None:
        import redis

        settings = getattr(knobs.cache, "redis", None) or knobs.redis
        self._key = key
        self._key_fmt = settings.key_format
        self._redis = redis.Redis(host=settings.host, port=settings.port)
