"""This process's counters, in one registry: what each stage did and the seconds it took.

Benchmarks (``bench/first_call.py``, ``benchmarks/``), ``cache info`` and tests read them;
no decision depends on them. A group is a mutable dataclass of one stage's counts, a module
attribute read at each use (tests replace a group with a fresh one); ``add`` counts under
one lock (the compile workers' threads and Inductor's precompile pool count too).
``snapshot()`` is every group as plain numbers, for a benchmark's JSON.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

_LOCK = threading.Lock()


class _Group:
    def add(self, **amounts: float) -> None:
        with _LOCK:
            for name, amount in amounts.items():
                setattr(self, name, getattr(self, name) + amount)


@dataclasses.dataclass
class KernelCounts(_Group):
    """Where this process's kernels came from (``compile/compiler.py``): the remote tier's
    fetch (one round trip) and adopt (stored on disk, linked, loaded) apart."""

    compiled: int = 0
    disk_hits: int = 0
    disk_misses: int = 0
    remote_hits: int = 0
    memory_hits: int = 0
    disk_load_s: float = 0.0
    remote_fetch_s: float = 0.0
    remote_adopt_s: float = 0.0
    compile_s: float = 0.0


@dataclasses.dataclass
class LoadCounts(_Group):
    """``load_kernel`` calls and their seconds, whatever each kernel's origin."""

    calls: int = 0
    seconds: float = 0.0


@dataclasses.dataclass
class RemoteCounts(_Group):
    """The remote tier's operations, their round trips, bytes each way and seconds."""

    hits: int = 0
    misses: int = 0
    rejected: int = 0
    published: int = 0
    errors: int = 0
    round_trips: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    seconds: float = 0.0


@dataclasses.dataclass
class DecisionCounts(_Group):
    """Tuning-decision lookups (``compile/cache/decisions.py``): where each was answered."""

    local_hits: int = 0
    remote_hits: int = 0
    misses: int = 0
    saved: int = 0
    lookup_s: float = 0.0


@dataclasses.dataclass
class WorkerCounts(_Group):
    """What the compile workers cost (``runtime/workers.py``): workers started (ready) and
    their seconds, the waits for them, the builds."""

    started: int = 0
    startup_s: float = 0.0
    ready_wait_s: float = 0.0
    queue_wait_s: float = 0.0
    builds: int = 0
    build_s: float = 0.0


@dataclasses.dataclass
class UpstreamCounts(_Group):
    """Upstream-style entries (``compile/upstream.py``): calls handed to TVM-FFI
    functions, those compiled, keys that fell back."""

    fast_calls: int = 0
    fast_compiled: int = 0
    fallbacks: int = 0


kernels = KernelCounts()
loads = LoadCounts()
remote = RemoteCounts()
decisions = DecisionCounts()
workers = WorkerCounts()
upstream = UpstreamCounts()

GROUPS = ("kernels", "loads", "remote", "decisions", "workers", "upstream")


def snapshot() -> dict[str, dict[str, Any]]:
    """Every group's counts, by group name."""
    return {name: dataclasses.asdict(globals()[name]) for name in GROUPS}
