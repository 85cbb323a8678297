"""A real Redis for the remote-cache tests: Debian's ``redis-server`` on a free port of
127.0.0.1, with no persistence, in a folder of the test's own; it lives as long as the
test (killed at teardown, and by the kernel if the test process dies first: PDEATHSIG).

Without ``redis-server`` or the ``redis`` package the tests that need it skip, saying
why (``make test`` installs the server when run as root); under CI (``CI`` set) they fail
instead, so that a CI run cannot pass without them.
"""

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import time

import pytest

HOST = "127.0.0.1"
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI must run the remote-cache tests")
    pytest.skip(f"{reason} (`make test` installs Debian's redis-server when run as root)")


class RedisServer:
    def __init__(self, folder) -> None:
        executable = shutil.which("redis-server")
        if executable is None:
            _unavailable("redis-server is not installed")
        try:
            import redis
        except ImportError:
            _unavailable("the redis package is not installed (the test extras have it)")
        self.port = _free_port()
        self.log = folder / "redis.log"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [executable, "--port", str(self.port), "--bind", HOST, "--save", "",
                 "--appendonly", "no", "--dir", str(folder), "--protected-mode", "yes",
                 "--logfile", ""],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent)
        self.client = redis.Redis(host=HOST, port=self.port, socket_timeout=10)
        deadline = time.monotonic() + 20
        while True:
            try:
                self.client.ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.close()
                    pytest.fail(f"redis-server did not start: {self.log.read_text()[-2000:]}")
                time.sleep(0.05)

    def env(self) -> dict[str, str]:
        """The variables that point a new process's remote tier at this server."""
        return {"CUTEDSL_INDUCTOR_REMOTE_CACHE": "1", "TORCHINDUCTOR_REDIS_HOST": HOST,
                "TORCHINDUCTOR_REDIS_PORT": str(self.port)}

    def keys(self) -> list[bytes]:
        return sorted(k.decode() for k in self.client.keys("pt2:cutedsl-inductor::*"))

    @contextlib.contextmanager
    def paused(self):
        """The server stopped (SIGSTOP): connections are accepted by the kernel, nothing
        answers."""
        self.process.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            self.process.send_signal(signal.SIGCONT)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
        self.process.wait(timeout=30)
