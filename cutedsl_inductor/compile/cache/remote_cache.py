"""The remote tier under the disk cache: kernels and tuning decisions on Redis, shared by
every machine that points at the same server.

Switched on as Inductor's remote caches are: ``CUTEDSL_INDUCTOR_REMOTE_CACHE=1``
(``config.remote_cache``), at Inductor's Redis address (``TORCHINDUCTOR_REDIS_URL``, else
``TORCHINDUCTOR_REDIS_HOST`` / ``_PORT``). A local miss is fetched here (``fetch``:
verified by ``portable.unpack``; the caller stores it locally and loads it) and what this
process compiles or decides is published (``publish``). The tier is Inductor's
remote-cache machinery: a ``RemoteCache`` (Inductor's controller, with its statistics
and wait counters) with a pass-through serde, keys laid out as Inductor lays out its own
(``pt2:<cache id>::<key>:c<version>``), and a backend of ours, because Inductor's
``RedisRemoteCacheBackend`` sets no timeouts (redis-py's defaults: none before 6.0, 5 s
and three retries since) and reads a value of any size. Ours waits at most
``config.remote_cache_timeout_ms`` to connect and for each reply, retries nothing, and
reads a value in one round trip through a script that sends it only where it is no longer
than ``portable.MAX_ENTRY_BYTES`` (``remote_backend.GET_BOUNDED``): an oversized value is
refused unread.

Failure semantics: nothing raises to the caller, and the local path goes on. Redis down
or slow (a connection error, a timeout) is one warning, and the tier is off for the rest
of the process, so that no later operation waits again; any other error of the server (a
write refused because it is full, read-only or wants a password; a key of another type)
is one warning per kind and the tier stays on; an entry that does not verify (garbage,
another key's or version's, oversized, unsealed under a fleet secret) is one warning and
a miss: the kernel compiles, and its publication replaces the entry.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
import time
from typing import Any

from ... import config, counters
from ...exc import PortableEntryError
from .portable import MAX_ENTRY_BYTES, fleet_secret, pack, unpack
from .redis_names import OversizedValue

log = logging.getLogger(__name__)

class RemoteTier:
    def __init__(self, address: str, client: Any, secret: bytes | None) -> None:
        self.address = address
        self.client = client
        self.secret = secret
        # Inductor's machinery, imported only where the tier is on (a compile worker's
        # process imports no Inductor otherwise)
        from .remote_backend import CuteDSLRemoteCache, RedisBackend

        self.cache = CuteDSLRemoteCache(RedisBackend(client, MAX_ENTRY_BYTES))
        self.off: str | None = None  # why the tier is off for this process
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    def fetch(self, kind: str, key: str) -> tuple[dict[str, Any], bytes] | None:
        """The verified (header, payload) of ``key``'s entry of ``kind``, or None."""
        if self.off is not None:
            return None
        start = time.perf_counter()
        try:
            blob = self.cache.get(f"{kind}:{key}")
        except OversizedValue as err:
            return self._refused(PortableEntryError(source=self.source, key=key,
                                                    reason=str(err)))
        except Exception as err:
            self._fault("read", err)
            return None
        finally:
            counters.remote.add(round_trips=1, seconds=time.perf_counter() - start)
        if blob is None:
            counters.remote.add(misses=1)
            return None
        counters.remote.add(bytes_read=len(blob))
        try:
            entry = unpack(blob, key, self.source, self.secret, kind)
        except PortableEntryError as err:
            return self._refused(err)
        counters.remote.add(hits=1)
        return entry

    def publish(self, kind: str, key: str, payload: bytes, fields: dict[str, Any]) -> None:
        if self.off is not None:
            return
        value = pack(kind, key, payload, fields, self.secret)
        start = time.perf_counter()
        try:
            self.cache.put(f"{kind}:{key}", value)
        except Exception as err:
            self._fault("write", err)
            return
        finally:
            counters.remote.add(round_trips=1, seconds=time.perf_counter() - start)
        counters.remote.add(published=1, bytes_written=len(value))

    def ping_ms(self) -> float:
        """One round trip to the server (raises what the client raises)."""
        start = time.perf_counter()
        self.client.ping()
        return (time.perf_counter() - start) * 1e3

    @property
    def source(self) -> str:
        return f"CuteDSL remote cache {self.address}:"

    def _refused(self, err: PortableEntryError) -> None:
        counters.remote.add(rejected=1)
        log.warning("%s; not used (a miss: what it held is made again, and replaces it)",
                    err)

    def _fault(self, action: str, err: Exception) -> None:
        import redis

        counters.remote.add(errors=1)
        reason = f"{type(err).__name__}: {err}"
        if isinstance(err, (redis.ConnectionError, redis.TimeoutError)):
            with self._lock:
                first, self.off = self.off is None, reason
            if first:
                log.warning("%s could not %s an entry (%s); off for the rest of this "
                            "process (the local cache and the compiler go on)", self.source,
                            action, reason)
            return
        with self._lock:
            first = f"{action} {type(err).__name__}" not in self._warned
            self._warned.add(f"{action} {type(err).__name__}")
        log.log(logging.WARNING if first else logging.DEBUG,
                "%s could not %s an entry (%s); going on without it", self.source, action,
                reason)


def default_tier() -> RemoteTier | None:
    """The remote tier as configured now; None when it is off or cannot be used (said
    once, in a warning)."""
    if not config.remote_cache:
        return None
    return _tier_for(config.redis_url, config.redis_host, config.redis_port,
                     config.remote_cache_timeout_ms, config.remote_cache_secret_file)


def address() -> str:
    """The configured server, without a password."""
    if config.redis_url:
        return re.sub(r"//[^@/]*@", "//***@", config.redis_url)
    return f"redis://{config.redis_host}:{config.redis_port}"


@functools.cache
def _tier_for(url: str | None, host: str, port: int, timeout_ms: int,
              secret_file: str | None) -> RemoteTier | None:
    try:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry
    except ImportError:
        log.warning("CuteDSL remote cache: the redis package is not installed (pip install "
                    "redis); off for this process")
        return None
    try:
        secret = fleet_secret()
    except OSError as err:
        log.warning("CuteDSL remote cache %s: the fleet secret %s cannot be used (%s); off "
                    "for this process", address(), secret_file, err.strerror or err)
        return None
    options = {"socket_timeout": timeout_ms / 1e3, "socket_connect_timeout": timeout_ms / 1e3,
               "retry": Retry(NoBackoff(), 0)}
    client = (redis.Redis.from_url(url, **options) if url
              else redis.Redis(host=host, port=port, **options))
    return RemoteTier(address(), client, secret)
