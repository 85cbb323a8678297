"""The compile workers' processes: the zygote that forks them, the parent's handles of it
(``Zygote``) and of each fork (``Worker``), and what a fork runs; ``workers.py`` hands
them builds.

A worker needs torch, this package's compile path and CuTe DSL imported: seconds of
CPU, and many seconds each where several interpreters import them at once beside
Inductor's own compile workers. So one zygote process per arch imports them, and each
worker is a fork of it, started in milliseconds with the imported modules shared
copy-on-write, as PyTorch's DataLoader forks its workers after ``import torch``.

Inductor is not among those imports: on a slow host they are half of the zygote's start,
which the first op's autotuning waits for. The zygote's environment sets ``WORKER_ENV``,
under which the package registers nothing in Inductor and imports only what compiling
needs; a build request is a ``Build`` (not Inductor's benchmark request) whose source the
requesting process wrote already; and a worker never talks to the remote tier (Inductor's
machinery): the requesting process fetches and publishes (``workers.py``).

The zygote never compiles and sees no GPU; it starts no thread pool (its environment
sets ``OPENBLAS_NUM_THREADS=1``), so a fork copies no lock a thread of its making holds.
On a machine with a CUDA driver, its imports may initialize the driver (no device
visible), which keeps a service thread: the forks never call the driver, as DataLoader
workers forked from a process with CUDA up never do.

The zygote is ``python -c ZYGOTE_SOURCE`` (not ``-m``, which would import this module
twice: as ``__main__`` and through the package). Protocol: its control socket (its end
of a socketpair, the descriptor number in ``argv``) carries one message per worker, the
worker's socket as a passed file descriptor. The zygote forks, says ``(READY, the
fork's pid, the time)`` on that socket and closes its copy; the fork serves builds, one
pickled request in and one pickled reply out, until end of file. The zygote, not the
fork, says it, so a worker is known by its pid from its first moment: one killed or
stopped before it ran a line (as one killed later) is the parent's to see and to end,
never a worker that could not start. What a fork or the zygote prints goes to stderr.

Failure semantics: the zygote closes its copy of each worker's socket, so a fork that
dies is end of file to the parent, and so is every socket still queued when the zygote
dies or could not start (the parent then turns the workers off). The zygote exits at end
of file on its control socket (the parent closed it or died); a fork exits at end of
file on its own, and quietly where the parent went away before it could reply (a
broken pipe: nothing is owed to anyone; the zygote, telling a parent gone already that
a fork is ready, goes on too). Both run in a session of
their own, so that a Ctrl-C at the terminal interrupts the parent alone, whose exit then
ends them. The parent reaps its zygote whenever it exits (a thread waits on it), so a
dead zygote leaves no zombie behind.

A worker that stops answering (a wedged compiler, a stopped process) is the parent's to
end: every wait on its socket is bounded (``config.compile_worker_timeout_s``:
``TimeoutError``), and ``Worker.kill`` sends it SIGKILL through a pidfd. The pidfd is
opened when the ready message is read, and taken as the worker's own only if its socket
is still open afterwards: the fork holds that socket until it exits, so while it is
open the pid cannot have passed to another process. A ready worker says nothing
unasked, so its socket readable between builds is its end (``Worker.gone``).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any, NamedTuple

from ..catalog import BUILTIN_TEMPLATES
from ..exc import CuteDSLInductorError

if TYPE_CHECKING:  # the package's import reads this module, and must not import torch
    from ..compile.records import KernelSource

READY = "ready"
# set in the zygote's environment (read by the package's ``__init__``)
WORKER_ENV = "_CUTEDSL_INDUCTOR_COMPILE_WORKER"
# what the zygote imports for every fork: the loader and compiler, our cache artifacts'
# type (a compile records its kernel as one), the CuTe DSL modules that kernel bodies use
# and what the built-in templates' kernels import (the GEMM's body: ``catalog.py``)
PRELOAD = ("cutedsl_inductor.runtime.loader", "cutedsl_inductor.compile.cache.artifacts",
           "cutlass.cute", "cutlass.pipeline",
           "cutlass.utils.hopper_helpers", "cutlass.cute.nvgpu.warpgroup",
           *(name for template in BUILTIN_TEMPLATES.values() for name in template.preload))
# what the zygote process runs; its argument is its control socket's descriptor
ZYGOTE_SOURCE = f"import sys; from {__name__} import zygote; zygote(int(sys.argv[1]))"


class Zygote:
    """The zygote process of an arch, as the parent holds it."""

    def __init__(self, arch: str) -> None:
        self.arch = arch
        self.control, theirs = socket.socketpair()
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="", CUTE_DSL_ARCH=arch,
                   OPENBLAS_NUM_THREADS="1", **{WORKER_ENV: "1"}, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", ZYGOTE_SOURCE, str(theirs.fileno())],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=env,
                start_new_session=True)  # a Ctrl-C at the terminal is the parent's to handle
        finally:
            theirs.close()
        threading.Thread(target=self.process.wait, name="cutedsl-zygote-reaper",
                         daemon=True).start()

    def fork(self) -> socket.socket:
        """A new worker's socket; the zygote says it is ready when it forks it.
        OSError: the zygote is gone."""
        mine, theirs = socket.socketpair()
        try:
            socket.send_fds(self.control, [b"w"], [theirs.fileno()])
        except OSError:
            mine.close()
            raise
        finally:
            theirs.close()
        return mine

    def close(self) -> None:
        self.control.close()  # the zygote exits at end of file

    def kill(self) -> None:
        """Stop it now, mid-import if need be (it forked no worker)."""
        self.process.kill()
        self.process.wait()
        self.control.close()


class NotStarted(Exception):
    """No ready message for a worker (the zygote died, or said nothing in time), or
    something else: workers cannot start (the environment, not a kernel)."""


class Worker:
    """A fork of the zygote, as the parent holds it; each wait on its socket is bounded
    by the ``timeout_s`` of the call."""

    def __init__(self, zygote: Zygote) -> None:
        self.arch = zygote.arch
        self.pid: int | None = None  # said when it is ready
        self.spawned_at = time.time()  # wall clock: the worker's ready time is another process's
        self.channel = zygote.fork()
        self.stream = self.channel.makefile("rwb")
        self._pidfd: int | None = None

    def wait_until_ready(self, timeout_s: float) -> float:
        """When the zygote said it was ready (its wall clock). NotStarted where the
        zygote exited first, or said nothing within ``timeout_s``."""
        self.channel.settimeout(timeout_s)
        try:
            said = pickle.load(self.stream)
        except TimeoutError as err:
            raise NotStarted(f"it was not ready after {timeout_s:g} s") from err
        except EOFError as err:
            raise NotStarted("the zygote that forks it exited") from err
        except pickle.UnpicklingError as err:
            raise NotStarted(f"its first words were not a pickle: {err}") from err
        if not (isinstance(said, tuple) and len(said) == 3 and said[0] == READY):
            raise NotStarted(f"it said {said!r} instead of ({READY!r}, its pid, its ready time)")
        self.pid = said[1]
        self._pidfd = self._open_pidfd(said[1])
        return said[2]

    def _open_pidfd(self, pid: int) -> int | None:
        """A pidfd of the worker, or None where it is gone already (see the module
        docstring: the pid is its own while its socket is open)."""
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            return None
        if select.select([self.channel], [], [], 0)[0]:  # it says nothing unasked: an end
            os.close(pidfd)
            return None
        return pidfd

    def gone(self) -> bool:
        """A ready worker that exited since (between builds it says nothing unasked: its
        socket readable is end of file)."""
        return self.pid is not None and bool(select.select([self.channel], [], [], 0)[0])

    def build(self, request: "Build", timeout_s: float) -> Any:
        """The worker's reply (see ``_build``). EOFError or OSError where it died,
        TimeoutError where it did not answer within ``timeout_s``."""
        self.channel.settimeout(timeout_s)
        pickle.dump(request, self.stream)
        self.stream.flush()
        return pickle.load(self.stream)

    def close(self) -> None:
        """The worker exits at end of file. What a cut-short request left unsent is
        dropped, not waited for."""
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        with contextlib.suppress(OSError):  # gone already
            self.channel.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):  # what is left to flush has nowhere to go
            self.stream.close()
        self.channel.close()

    def kill(self) -> None:
        """End it now (it stopped answering), then close it; the zygote reaps it."""
        if self._pidfd is not None:
            with contextlib.suppress(ProcessLookupError):  # it died already
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
        self.close()


class Build(NamedTuple):
    """What a worker is asked to build: the kernel, the knobs that locate its binary (the
    cache folder resolved: the worker does not ask Inductor; the remote tier off), and
    the path where the requesting process wrote its source."""

    kernel: KernelSource
    knobs: dict[str, Any]
    path: str

    def load(self) -> Any:
        """Build it into the disk cache the knobs name. What a worker built before is
        forgotten first: its product is the entry on disk, and a kernel it kept in memory
        would be answered from there though that cache (another, since) lacks it."""
        from .. import config
        from ..compile import compiler
        from .loader import load

        compiler._COMPILED.clear()
        with config.patch(**self.knobs):
            return load(self.kernel, path=self.path)


class Failed(NamedTuple):
    """A worker's failure that is not about the kernel (its text)."""

    text: str


def zygote(control_fd: int) -> None:
    """The zygote's loop: fork a worker for each socket received, until end of file."""
    os.dup2(2, 1)  # prints go to stderr
    preload()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the forks
    control = socket.socket(fileno=control_fd)
    while True:
        try:
            _, fds, _, _ = socket.recv_fds(control, 1, 1)
        except ConnectionResetError:  # the parent died
            return
        if not fds:
            return
        pid = os.fork()
        if pid == 0:
            control.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os._exit(_serve(socket.socket(fileno=fds[0])))  # not the zygote's exit handlers
        _announce(fds[0], pid)


def _announce(fd: int, pid: int) -> None:
    """Say on a fork's socket that it is ready (its pid, the time), then close the
    zygote's copy; a parent that went away already is nobody to tell."""
    with socket.socket(fileno=fd) as channel, contextlib.suppress(OSError):
        channel.sendall(pickle.dumps((READY, pid, time.time())))


def preload() -> None:
    """The zygote's imports."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)


def _serve(channel: socket.socket) -> int:
    """A fork's loop: one request in, one reply out, until the parent closes the socket;
    its exit status."""
    stream = channel.makefile("rwb")
    try:
        while True:
            try:
                request = pickle.load(stream)
            except EOFError:
                return 0
            pickle.dump(_build(request), stream)
            stream.flush()
    except (BrokenPipeError, ConnectionResetError):  # the parent went away: none to tell
        return 0
    except BaseException:  # noqa: BLE001 - said on stderr; the parent sees end of file
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()  # the fork ends in os._exit, which flushes nothing
        sys.stderr.flush()


def _build(request: Any) -> str | CuteDSLInductorError | Failed:
    """Compile into the disk cache. The reply: where the kernel came from ("compiled",
    "disk", "remote"), our error about the kernel (picklable), or any other failure."""
    try:
        return request.load().origin
    except CuteDSLInductorError as err:
        return err
    except Exception as err:
        return Failed(f"{type(err).__name__}: {err}")
