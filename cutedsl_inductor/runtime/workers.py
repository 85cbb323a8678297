"""Compile in worker processes. CuTe DSL's compiler is not re-entrant, so a process
compiles one kernel at a time (``compiler.COMPILE_LOCK``), and the choices Inductor
precompiles from its thread pool would compile one after another. With
``config.compile_workers`` > 0, ``build_in_worker(request)`` hands a choice's picklable
request (``autotune/benchmark_request.py``) to one of that many worker processes, which
compiles it into the disk cache; the choice then loads the binary from there (a disk
hit, milliseconds). A kernel already in memory or on disk never goes to a worker, nor
does an upstream-style entry (it compiles in its first call, not when loaded).

With ``config.compile_prefetch`` a choice's build starts when the choice is made
(``prefetch``, from background threads), not when Inductor precompiles it: under
max-autotune Inductor defers that to each op's autotuning, one op after another, so the
kernels of later ops build while earlier ones are timed. One kernel is built by one
worker at a time: a build asked for while another is under way waits for it.

Without prefetch the workers still start ahead: the first choice whose kernel must be
built starts ``config.compile_workers`` of them (``start_ahead``), and earlier still a
compile that starts with CUTEDSL among Inductor's GEMM backends starts their zygote
(``start_zygote``, from dynamo's compile-start callback, ``inductor/install.py``), whose
imports then overlap the compile's tracing. A zygote that forked no worker by the
compile's end is stopped (``stop_unused_zygote``), and after a warm compile (served from
Inductor's caches) later compiles of this process start none ahead.

A worker is a fork of a zygote process (``zygote.py``), which imports torch, this
package's compile path and CuTe DSL (not Inductor) once for all the workers of an arch;
both are kept for the life of this process. The zygote is a fresh interpreter, not a fork
of this process: it never re-runs the user's script, and this process's CUDA and CuTe
state stays out of it. It sees no GPU (a compile needs none, and a CUDA context per
worker would cost GPU memory) and compiles for the arch resolved here (``CUTE_DSL_ARCH``,
read when CuTe is first imported; a request for another arch replaces the zygote and
workers). The remote tier is this process's to use: a kernel it has is fetched here, and
what a worker compiled is published from here.

Failure semantics (every wait on a worker is bounded: ``config.compile_worker_timeout_s``):
- a worker that cannot start (it, or the zygote, dies or says nothing in time before it
  says it is ready: the interpreter or the environment, not a kernel) turns the workers
  off for this process, with one warning, and the zygote is killed; kernels compile here;
- an error of ours in a worker (``KernelCompileError`` naming template, parameters and
  generated file; ``GeneratedCodeError``) comes back and is raised here;
- a worker that dies in a build or does not answer in time (killed from outside, a
  compiler crash, a wedged ptxas, a stopped process) is killed and replaced on the next
  need, and the build goes to another worker, with one warning; where it fails there
  too, the kernel is what kills or wedges compilers: ``CompileWorkerError``. Either
  error drops the choice, and this process does not compile it again;
- any other failure in a worker (its environment, not the kernel) is logged and the
  kernel compiles here instead.
Without a disk cache it can write (none, or one used read-only) a worker could hand
nothing back: none is used.

``counters.workers`` counts what the workers cost this process: workers started and their seconds
from spawn to ready (each says when it was ready), the seconds callers waited for a
worker to be ready and for one to be free, and the builds and their round trips.
"""

from __future__ import annotations

import logging
import pickle
import queue
import re
import threading
import time
from typing import Any

from .. import config, counters
from ..compile import compiler
from ..compile.compiler import entry_name
from ..compile.cache.disk_cache import default_cache, default_root
from ..exc import CompileWorkerError, CuteDSLInductorError, format_params
from .loader import describe_kernel, kernel_key, source_file
from .zygote import Build, Failed, NotStarted, Worker, Zygote

log = logging.getLogger(__name__)




# idle workers, how many are running and the zygote that forks them (guarded by _LOCK);
# why workers cannot start here
_IDLE: "queue.SimpleQueue[Worker]" = queue.SimpleQueue()
_running = 0
_zygote: Zygote | None = None
_stopped_unused = False  # a zygote started ahead was stopped unused (``start_zygote``)
_LOCK = threading.Lock()
_cannot_start: str | None = None
# kernel key -> set when its worker build ends, and how many prefetch threads serve the
# prefetch queue (both guarded by _LOCK)
_BUILDING: dict[str, threading.Event] = {}
_PREFETCHES: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
_prefetchers = 0


def build_in_worker(request: Any, background: bool = False) -> str | None:
    """Compile ``request``'s kernel into the disk cache in a worker process, unless no
    worker could help (none configured, no writable disk cache, the kernel already
    built): where the worker found it ("compiled", "disk"), or None when no worker
    built it here (a build of it already under way elsewhere in this process is waited
    for: the disk cache then has it, or the caller's own load compiles it and says why
    it cannot). ``background`` (a prefetch thread): where the request's knobs are no
    longer this process's, nothing is done (``config.patch`` from that thread could
    restore stale globals under another thread's feet)."""
    key = _worker_build_key(request, background)
    if key is None:
        return None
    with _LOCK:
        under_way = _BUILDING.get(key)
        if under_way is None:
            _BUILDING[key] = mine = threading.Event()
    if under_way is not None:
        under_way.wait()
        return None
    try:
        return _build_with_the_tier(request, key)
    finally:
        with _LOCK:
            del _BUILDING[key]
        mine.set()


def _build_with_the_tier(request: Any, key: str) -> str | None:
    """Where the remote tier is on, a kernel it has is fetched here, and what a worker
    compiled is published from here: a worker never talks to it (``zygote.py``). The
    request's knobs are patched in only around what reads them (``_key_to_build``)."""
    with config.patch(**_changed(request.knobs)):
        build, remote = _build_for(request), config.remote_cache
        describe = describe_kernel(build.kernel, build.path)
        cached = remote and compiler.cached_kernel(key, describe.at(build.knobs["arch"]))
    if cached:
        return cached[1]
    origin = _build_in_a_worker(request, build)
    if remote and origin == "compiled":
        with config.patch(**_changed(request.knobs)):
            compiler.publish_stored(key)
    return origin


def prefetch(request: Any) -> None:
    """With ``config.compile_prefetch``, start building ``request``'s kernel in a worker
    now, from a background thread, instead of when Inductor precompiles its choice (it
    defers that to the choice's autotuning, one op after another): what is built is in
    the disk cache by then, or under way and waited for. Without it, the workers start
    ahead (``start_ahead``). A prefetch never raises; a failed one leaves the kernel to
    its precompile, which says why."""
    global _prefetchers
    if config.compile_workers < 1:
        return
    if not config.compile_prefetch:
        start_ahead(request)
        return
    _PREFETCHES.put(request)
    with _LOCK:
        start = _prefetchers < config.compile_workers
        _prefetchers += start
    if start:
        threading.Thread(target=_prefetching, name="cutedsl-prefetch", daemon=True).start()


def start_ahead(request: Any) -> None:
    """Start the workers that ``request``'s build will want, unless they run already or
    it needs none (see the module docstring). Never raises: a worker that cannot be
    spawned is left to the build, which says why."""
    global _running
    if _running >= config.compile_workers:
        return
    try:
        if _worker_build_key(request, background=True) is None:
            return
    except Exception as err:  # noqa: BLE001 - the choice's precompile raises it again, in full
        log.debug("starting compile workers ahead for %s: %s", request.kernel_name, err)
        return
    started = []
    with _LOCK:
        try:
            while _running < config.compile_workers:
                started.append(Worker(_zygote_for(request.knobs["arch"])))
                _running += 1
        except OSError as err:
            log.debug("starting compile workers ahead: %s", err)
    for worker in started:
        _IDLE.put(worker)


def _prefetching() -> None:
    """A prefetch thread: build queued requests for good (one whose knobs are no longer
    this process's is dropped)."""
    while True:
        request = _PREFETCHES.get()
        try:
            build_in_worker(request, background=True)
        except Exception as err:  # noqa: BLE001 - its precompile raises it again, in full
            log.debug("prefetching %s failed: %s", request.kernel_name, err)


def _build_in_a_worker(request: Any, build: Build) -> str | None:
    """The build in a worker; one that dies or stops answering in it is retired (killed)
    and the build goes to another, once (see the module docstring)."""
    retried = False
    while True:
        try:
            worker = _acquire(request.knobs["arch"])
        except OSError as err:  # not even spawned
            _give_up(f"{type(err).__name__}: {err}")
            return None
        try:
            reply = _run(worker, build)
        except NotStarted as err:
            _retire(worker)
            _give_up(str(err))
            return None
        except (EOFError, OSError, pickle.UnpicklingError) as err:
            _retire(worker)
            why = _what_happened(worker, err)
            if retried:
                raise CompileWorkerError(kernel=request.kernel_name,
                                         template=request.kernel.template,
                                         params=format_params(request.kernel.params),
                                         cause=f"in a second worker too, the worker {why}"
                                         ) from err
            log.warning("a compile worker %s building %s; it was stopped, and the kernel "
                        "goes to another worker", why, request.kernel_name)
            retried = True
            continue
        _IDLE.put(worker)
        if isinstance(reply, Failed):
            log.warning("a compile worker failed on %s (%s); compiling it in this process",
                        request.kernel_name, reply.text)
            return None
        if isinstance(reply, CuteDSLInductorError):
            raise reply
        return reply


def _run(worker: Worker, build: Build) -> Any:
    """``build`` in ``worker`` (waited for until ready first), counted in
    ``counters.workers``."""
    timeout_s = config.compile_worker_timeout_s
    if worker.pid is None:
        start = time.perf_counter()
        ready_at = worker.wait_until_ready(timeout_s)
        counters.workers.add(started=1, startup_s=max(ready_at - worker.spawned_at, 0.0),
                             ready_wait_s=time.perf_counter() - start)
    start = time.perf_counter()
    reply = worker.build(build, timeout_s)
    counters.workers.add(builds=1, build_s=time.perf_counter() - start)
    return reply


def _what_happened(worker: Worker, err: BaseException) -> str:
    who = f"(pid {worker.pid})"
    if isinstance(err, TimeoutError):
        return f"{who} did not answer within {config.compile_worker_timeout_s} s"
    if isinstance(err, (EOFError, BrokenPipeError, ConnectionResetError)):
        return f"{who} died ({type(err).__name__})"
    return f"{who} failed ({type(err).__name__}: {err})"


def _build_for(request: Any) -> Build:
    """``request`` as a worker's ``Build`` (called under its knobs): its source written
    here, its cache folder resolved, the remote tier off."""
    return Build(request.kernel,
                 request.knobs | {"cache_dir": str(default_root()), "remote_cache": False},
                 source_file(request.kernel.source)[1])


def _give_up(reason: str) -> None:
    """Workers cannot start here: from now on this process compiles (said once). The
    zygote is killed (it may be the one stopped)."""
    global _cannot_start, _zygote
    with _LOCK:
        first, _cannot_start = _cannot_start is None, reason
        if _zygote is not None:
            _zygote.kill()
            _zygote = None
    if first:
        log.warning("compile workers cannot start (%s); CuteDSL kernels compile in this "
                    "process", reason)


def shutdown() -> None:
    """Stop the zygote and the idle workers (busy ones stop when their build returns)."""
    global _running, _zygote
    with _LOCK:
        while not _IDLE.empty():
            _IDLE.get().close()
            _running -= 1
        if _zygote is not None:
            _zygote.close()
            _zygote = None


def start_zygote() -> None:
    """Start the zygote of the target arch now, unless it runs, one started so was stopped
    unused after a warm compile (a warm process starts none ahead again), or no worker
    could be used (none configured, no disk cache it could write, workers unable to start
    here). Never raises: a zygote that cannot be spawned is left to the first build,
    which says why."""
    if (config.compile_workers < 1 or not config.disk_cache or _cannot_start is not None
            or _stopped_unused or not default_cache().mode.writable):
        return
    arch = compiler.target_arch()  # after the checks: it may initialize CUDA to ask the GPU
    with _LOCK:
        try:
            _zygote_for(arch)
        except OSError as err:
            log.debug("starting the compile workers' zygote ahead: %s", err)


def stop_unused_zygote(warm: bool) -> None:
    """Stop the zygote if it forked no worker (what it was started for built nothing);
    after a ``warm`` compile (one served from Inductor's caches) start none ahead again."""
    global _zygote, _stopped_unused
    with _LOCK:
        if _zygote is not None and _running == 0:
            _zygote.kill()
            _zygote = None
            _stopped_unused = _stopped_unused or warm


def _zygote_for(arch: str) -> Zygote:
    """The zygote of ``arch``, started now if need be (one of another arch is stopped:
    its idle workers go when next acquired). Called under _LOCK; OSError: none started."""
    global _zygote
    if _zygote is None or _zygote.arch != arch:
        if _zygote is not None:
            _zygote.close()
        _zygote = Zygote(arch)
    return _zygote


def _compiles_when_loaded(request: Any) -> bool:
    """A ``@cute.jit`` entry compiles when loaded; an upstream-style entry compiles in
    its first call, here (nothing a worker could do ahead)."""
    return re.search(rf"@cute\.jit\s*\ndef {entry_name(request.kernel_name)}\(",
                     request.kernel.source) is not None


def _changed(knobs: dict[str, Any]) -> dict[str, Any]:
    """Those of ``knobs`` that differ from this process's now."""
    return {name: value for name, value in knobs.items() if getattr(config, name) != value}


def _worker_build_key(request: Any, background: bool) -> str | None:
    """``request``'s kernel key where a worker could build it (workers configured and
    able to start, an entry that compiles when loaded, ``_key_to_build``); else None."""
    if (config.compile_workers < 1 or not config.disk_cache or _cannot_start is not None
            or not _compiles_when_loaded(request)):
        return None
    return _key_to_build(request, background)


def _key_to_build(request: Any, background: bool) -> str | None:
    """``request``'s kernel key where what a worker stores would reach this process: the
    disk cache takes it (it is writable) and the kernel is neither compiled here nor
    there yet; else None. Its knobs are patched in only where they differ (an empty
    patch writes nothing), and not at all for a ``background`` request: it is dropped."""
    changed = _changed(request.knobs)
    if changed and background:
        return None
    with config.patch(**changed):
        cache = default_cache()
        key = kernel_key(request.kernel)
        usable = cache.mode.writable and key not in compiler._COMPILED and not cache.has(key)
    return key if usable else None


def _acquire(arch: str) -> Worker:
    global _running
    while True:
        with _LOCK:
            if _IDLE.empty() and _running < config.compile_workers:
                worker = Worker(_zygote_for(arch))  # OSError: none started
                _running += 1
                return worker
        start = time.perf_counter()
        worker = _IDLE.get()  # waits for a busy one
        counters.workers.add(queue_wait_s=time.perf_counter() - start)
        if worker.arch == arch:
            return worker
        worker.close()  # compiles for another arch
        with _LOCK:
            _running -= 1


def _retire(worker: Worker) -> None:
    """Kill a worker that failed (it may be stopped or wedged) and count it gone."""
    global _running
    worker.kill()
    with _LOCK:
        _running -= 1
