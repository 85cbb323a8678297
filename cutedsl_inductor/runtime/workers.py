"""Compile in worker processes. CuTe DSL's compiler is not re-entrant, so a process
compiles one kernel at a time (``compiler.COMPILE_LOCK``), and the choices Inductor
precompiles from its thread pool would compile one after another. With
``config.compile_workers`` > 0, ``pool().build(request)`` hands a choice's picklable
request (``autotune/benchmark_request.py``) to one of that many worker processes, which
compiles it into the disk cache; the choice then loads the binary from there (a disk
hit, milliseconds). A kernel already in memory or on disk never goes to a worker, nor
does an upstream-style entry (it compiles in its first call, not when loaded): what a
worker is asked for is ``worker_builds.py``'s.

The pool is a ``WorkerPool``: it owns its zygote, its workers (idle, or how many run),
the builds under way and its prefetch threads, and whether workers cannot start; two
pools share none of it. This process uses one, ``pool()`` (the callers: a choice's
precompile and prefetch, ``precompile.py``, dynamo's compile callbacks).

With ``config.compile_prefetch`` a choice's build starts when the choice is made
(``prefetch``, from background threads), not when Inductor precompiles it: under
max-autotune Inductor defers that to each op's autotuning, one op after another, so the
kernels of later ops build while earlier ones are timed. One kernel is built by one
worker of a pool at a time: a build asked for while another is under way waits for it.

Without prefetch the workers still start ahead: the first choice whose kernel must be
built starts ``config.compile_workers`` of them (``start_ahead``), and earlier still a
compile that starts with CUTEDSL among Inductor's GEMM backends starts their zygote
(``start_zygote``, from dynamo's compile-start callback, ``inductor/install.py``), whose
imports then overlap the compile's tracing. A zygote that forked no worker by the
compile's end is stopped (``stop_unused_zygote``), and after a warm compile (served from
Inductor's caches) later compiles of this process start none ahead.

A worker is a fork of a zygote process (``zygote.py``), which imports torch, this
package's compile path and CuTe DSL (not Inductor) once for all the workers of an arch;
both are kept until ``shutdown`` (or the end of this process). The zygote is a fresh
interpreter, not a fork of this process: it never re-runs the user's script, and this
process's CUDA and CuTe state stays out of it. It sees no GPU (a compile needs none, and
a CUDA context per worker would cost GPU memory) and compiles for the arch resolved here
(``CUTE_DSL_ARCH``, read when CuTe is first imported; a request for another arch
replaces the zygote and workers). The remote tier is this process's to use: a kernel it
has is fetched here, and what a worker compiled is published from here.

Failure semantics (every wait on a worker is bounded: ``config.compile_worker_timeout_s``):
- workers that cannot start (the zygote dies or says nothing in time before a worker is
  ready: the interpreter or the environment, not a kernel; or worker after worker exits
  as soon as it is made) turn the pool's workers off, with one warning, and the zygote
  is killed; kernels compile here;
- a worker that exits before it is given a build (killed from outside, before its first
  build or between two: the zygote says a fork is ready when it forks it, so a worker
  is never struck before the pool knows its pid) is retired and replaced, with one
  warning, and charged to no kernel;
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
from spawn to ready (the zygote says when each was ready), the seconds callers waited for a
worker to be ready and for one to be free, and the builds and their round trips.
"""

from __future__ import annotations

import logging
import pickle
import queue
import threading
import time
from typing import Any

from .. import config, counters
from ..compile import compiler
from ..compile.cache.disk_cache import default_cache
from ..exc import CompileWorkerError, CuteDSLInductorError, format_params
from .loader import describe_kernel
from .worker_builds import build_for, buildable_key, changed
from .zygote import Build, Failed, NotStarted, Worker, Zygote

log = logging.getLogger(__name__)


class WorkerPool:
    """Compile workers of one zygote, at most ``config.compile_workers`` of them (see the
    module docstring). Its counts, zygote and builds under way are guarded by its lock;
    the queues are thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: queue.SimpleQueue[Worker] = queue.SimpleQueue()
        self._running = 0  # workers started and not retired: idle or building
        self._zygote: Zygote | None = None
        self._stopped_unused = False  # a zygote started ahead was stopped unused
        self._cannot_start: str | None = None  # why workers cannot start here
        self._building: dict[str, threading.Event] = {}  # kernel key -> set when built
        self._prefetches: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._prefetchers = 0  # threads serving ``_prefetches``

    @property
    def running(self) -> int:
        """Workers started and not retired (idle or building)."""
        return self._running

    @property
    def idle(self) -> int:
        return self._idle.qsize()

    @property
    def zygote(self) -> Zygote | None:
        return self._zygote

    @property
    def stopped_unused(self) -> bool:
        """A zygote started ahead was stopped unused after a warm compile."""
        return self._stopped_unused

    @property
    def cannot_start(self) -> str | None:
        """Why workers cannot start here (then every kernel compiles in this process)."""
        return self._cannot_start

    def build(self, request: Any, background: bool = False) -> str | None:
        """Compile ``request``'s kernel into the disk cache in a worker process, unless no
        worker could help (none configured, no writable disk cache, the kernel already
        built): where the worker found it ("compiled", "disk"), or None when no worker
        built it here (a build of it already under way in this pool is waited for: the
        disk cache then has it, or the caller's own load compiles it and says why it
        cannot). ``background`` (a prefetch thread): where the request's knobs are no
        longer this process's, nothing is done (``worker_builds.key_to_build``)."""
        key = self._worker_build_key(request, background)
        if key is None:
            return None
        with self._lock:
            under_way = self._building.get(key)
            if under_way is None:
                self._building[key] = mine = threading.Event()
        if under_way is not None:
            under_way.wait()
            return None
        try:
            return self._build_with_the_tier(request, key)
        finally:
            with self._lock:
                del self._building[key]
            mine.set()

    def prefetch(self, request: Any) -> None:
        """With ``config.compile_prefetch``, start building ``request``'s kernel in a
        worker now, from a background thread, instead of when Inductor precompiles its
        choice (it defers that to the choice's autotuning, one op after another): what is
        built is in the disk cache by then, or under way and waited for. Without it, the
        workers start ahead (``start_ahead``). A prefetch never raises; a failed one
        leaves the kernel to its precompile, which says why."""
        if config.compile_workers < 1:
            return
        if not config.compile_prefetch:
            self.start_ahead(request)
            return
        self._prefetches.put(request)
        with self._lock:
            start = self._prefetchers < config.compile_workers
            self._prefetchers += start
        if start:
            threading.Thread(target=self._prefetching, name="cutedsl-prefetch",
                             daemon=True).start()

    def start_ahead(self, request: Any) -> None:
        """Start the workers that ``request``'s build will want, unless they run already
        or it needs none (see the module docstring). Never raises: a worker that cannot
        be spawned is left to the build, which says why."""
        if self._running >= config.compile_workers:
            return
        try:
            if self._worker_build_key(request, background=True) is None:
                return
        except Exception as err:  # noqa: BLE001 - the choice's precompile raises it again, in full
            log.debug("starting compile workers ahead for %s: %s", request.kernel_name, err)
            return
        self.start_workers(request.knobs["arch"])

    def start_workers(self, arch: str) -> None:
        """Spawn workers of ``arch`` (and their zygote) until ``config.compile_workers``
        run; their ready messages are read when first used. Never raises: a worker that
        cannot be spawned is left to the build, which says why."""
        started = []
        with self._lock:
            try:
                while self._running < config.compile_workers:
                    started.append(Worker(self._zygote_for(arch)))
                    self._running += 1
            except OSError as err:
                log.debug("starting compile workers ahead: %s", err)
        for worker in started:
            self._idle.put(worker)

    def start_zygote(self) -> None:
        """Start the zygote of the target arch now, unless it runs, one started so was
        stopped unused after a warm compile (a warm process starts none ahead again), or
        no worker could be used (none configured, no disk cache it could write, workers
        unable to start here). Never raises: a zygote that cannot be spawned is left to
        the first build, which says why."""
        if (config.compile_workers < 1 or not config.disk_cache
                or self._cannot_start is not None or self._stopped_unused
                or not default_cache().mode.writable):
            return
        arch = compiler.target_arch()  # after the checks: it may initialize CUDA to ask the GPU
        with self._lock:
            try:
                self._zygote_for(arch)
            except OSError as err:
                log.debug("starting the compile workers' zygote ahead: %s", err)

    def stop_unused_zygote(self, warm: bool) -> None:
        """Stop the zygote if it forked no worker (what it was started for built nothing);
        after a ``warm`` compile (one served from Inductor's caches) start none ahead
        again."""
        with self._lock:
            if self._zygote is not None and self._running == 0:
                self._zygote.kill()
                self._zygote = None
                self._stopped_unused = self._stopped_unused or warm

    def shutdown(self) -> None:
        """Stop the zygote and the idle workers (busy ones stop when their build returns).
        The pool can be used again: the next build starts them anew."""
        with self._lock:
            while not self._idle.empty():
                self._idle.get().close()
                self._running -= 1
            if self._zygote is not None:
                self._zygote.close()
                self._zygote = None

    def _worker_build_key(self, request: Any, background: bool) -> str | None:
        if self._cannot_start is not None:
            return None
        return buildable_key(request, background)

    def _build_with_the_tier(self, request: Any, key: str) -> str | None:
        """Where the remote tier is on, a kernel it has is fetched here, and what a worker
        compiled is published from here: a worker never talks to it (``zygote.py``). The
        request's knobs are patched in only around what reads them."""
        with config.patch(**changed(request.knobs)):
            build, remote = build_for(request), config.remote_cache
            describe = describe_kernel(build.kernel, build.path)
            cached = remote and compiler.cached_kernel(key, describe.at(build.knobs["arch"]))
        if cached:
            return cached[1]
        origin = self._build_in_a_worker(request, build)
        if remote and origin == "compiled":
            with config.patch(**changed(request.knobs)):
                compiler.publish_stored(key)
        return origin

    def _prefetching(self) -> None:
        """A prefetch thread: build queued requests for good (one whose knobs are no
        longer this process's is dropped)."""
        while True:
            request = self._prefetches.get()
            try:
                self.build(request, background=True)
            except Exception as err:  # noqa: BLE001 - its precompile raises it again, in full
                log.debug("prefetching %s failed: %s", request.kernel_name, err)

    def _build_in_a_worker(self, request: Any, build: Build) -> str | None:
        """The build in a worker; one that dies or stops answering in it is retired
        (killed) and the build goes to another, once (see the module docstring)."""
        retried = False
        while True:
            try:
                worker = self._acquire(request.knobs["arch"])
            except OSError as err:  # not even spawned
                self._give_up(f"{type(err).__name__}: {err}")
                return None
            except NotStarted as err:
                self._give_up(str(err))
                return None
            try:
                reply = _run(worker, build)
            except (EOFError, OSError, pickle.UnpicklingError) as err:
                self._retire(worker)
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
            self._idle.put(worker)
            if isinstance(reply, Failed):
                log.warning("a compile worker failed on %s (%s); compiling it in this process",
                            request.kernel_name, reply.text)
                return None
            if isinstance(reply, CuteDSLInductorError):
                raise reply
            return reply

    def _give_up(self, reason: str) -> None:
        """Workers cannot start here: from now on this process compiles (said once). The
        zygote is killed (it may be the one stopped)."""
        with self._lock:
            first, self._cannot_start = self._cannot_start is None, reason
            if self._zygote is not None:
                self._zygote.kill()
                self._zygote = None
        if first:
            log.warning("compile workers cannot start (%s); CuteDSL kernels compile in this "
                        "process", reason)

    def _zygote_for(self, arch: str) -> Zygote:
        """The zygote of ``arch``, started now if need be (one of another arch is stopped:
        its idle workers go when next acquired). Called under the lock; OSError: none
        started."""
        if self._zygote is None or self._zygote.arch != arch:
            if self._zygote is not None:
                self._zygote.close()
            self._zygote = Zygote(arch)
        return self._zygote

    def _acquire(self, arch: str) -> Worker:
        """A ready worker of ``arch`` that is still there: one that exited since it was
        made or last used (killed from outside, before its first build or between two)
        is retired and replaced, charged to no kernel. NotStarted: no ready message came
        (that worker retired), or one worker after another exited unused; OSError: none
        spawned."""
        for _ in range(config.compile_workers + 2):
            worker = self._take(arch)
            try:
                _wait_until_ready(worker)
            except NotStarted:
                self._retire(worker)
                raise
            if not worker.gone():
                return worker
            log.warning("a compile worker (pid %d) exited before it was given a build; "
                        "another takes its place", worker.pid)
            self._retire(worker)
        raise NotStarted(f"{config.compile_workers + 2} workers in a row exited unused")

    def _take(self, arch: str) -> Worker:
        """An idle worker of ``arch``, or a new one while fewer than
        ``config.compile_workers`` run, else the next to be free."""
        while True:
            with self._lock:
                if self._idle.empty() and self._running < config.compile_workers:
                    worker = Worker(self._zygote_for(arch))  # OSError: none started
                    self._running += 1
                    return worker
            start = time.perf_counter()
            worker = self._idle.get()  # waits for a busy one
            counters.workers.add(queue_wait_s=time.perf_counter() - start)
            if worker.arch == arch:
                return worker
            worker.close()  # compiles for another arch
            with self._lock:
                self._running -= 1

    def _retire(self, worker: Worker) -> None:
        """Kill a worker that failed (it may be stopped or wedged) and count it gone."""
        worker.kill()
        with self._lock:
            self._running -= 1


def _wait_until_ready(worker: Worker) -> None:
    """A new worker's ready message, waited for and counted in ``counters.workers``."""
    if worker.pid is None:
        start = time.perf_counter()
        ready_at = worker.wait_until_ready(config.compile_worker_timeout_s)
        counters.workers.add(started=1, startup_s=max(ready_at - worker.spawned_at, 0.0),
                             ready_wait_s=time.perf_counter() - start)


def _run(worker: Worker, build: Build) -> Any:
    """``build`` in a ready ``worker``, counted in ``counters.workers``."""
    start = time.perf_counter()
    reply = worker.build(build, config.compile_worker_timeout_s)
    counters.workers.add(builds=1, build_s=time.perf_counter() - start)
    return reply


def _what_happened(worker: Worker, err: BaseException) -> str:
    who = f"(pid {worker.pid})"
    if isinstance(err, TimeoutError):
        return f"{who} did not answer within {config.compile_worker_timeout_s} s"
    if isinstance(err, (EOFError, BrokenPipeError, ConnectionResetError)):
        return f"{who} died ({type(err).__name__})"
    return f"{who} failed ({type(err).__name__}: {err})"


_POOL = WorkerPool()


def pool() -> WorkerPool:
    """This process's worker pool."""
    return _POOL
