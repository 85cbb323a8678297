"""The compile workers' zygote: a real interpreter importing the package and CuTe DSL, and
real forks of it."""

import os
import pickle
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from cutedsl_inductor import config
from cutedsl_inductor.kernels.gemm.template import gemm_choices
from cutedsl_inductor.runtime import worker_builds
from cutedsl_inductor.runtime.zygote import READY, WORKER_ENV, ZYGOTE_SOURCE, Zygote
from tests.helpers import make_input, make_layout, process_state, wait_until


def test_the_zygote_forks_ready_workers_and_holds_no_thread_but_the_drivers():
    """A fork of a process with more than one thread could copy a lock another thread
    holds; the CUDA driver's service thread, on a machine with a driver, is the one
    allowed (the forks never call the driver)."""
    zygote = Zygote("sm_90a")
    try:
        channels = [zygote.fork() for _ in range(2)]
        said = [pickle.load(channel.makefile("rb")) for channel in channels]
        assert [s[0] for s in said] == [READY] * 2
        assert len({s[1] for s in said}) == 2 and all(abs(time.time() - s[2]) < 120 for s in said)
        tasks = f"/proc/{zygote.process.pid}/task"
        others = [open(f"{tasks}/{t}/comm").read().strip() for t in os.listdir(tasks)
                  if int(t) != zygote.process.pid]
        assert all(name.startswith("cuda") for name in others), others
        # a Ctrl-C at the terminal reaches the parent's process group, not them
        assert {os.getsid(s[1]) for s in said} == {os.getsid(zygote.process.pid)} != {os.getsid(0)}
    finally:
        zygote.close()
    assert zygote.process.wait(timeout=60) == 0  # end of file on its control socket
    for channel in channels:
        channel.close()


def test_the_zygote_command_imports_its_module_once_and_warns_of_nothing():
    """``python -m`` would import it twice, as __main__ and through the package, and
    runpy would warn."""
    mine, theirs = socket.socketpair()
    mine.close()  # end of file once it has imported what it preloads
    run = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-c",
                          ZYGOTE_SOURCE, str(theirs.fileno())], pass_fds=[theirs.fileno()],
                         capture_output=True, timeout=120)
    theirs.close()
    assert run.returncode == 0 and b"Warning" not in run.stderr, run.stderr.decode()[-2000:]


def test_a_zygote_killed_mid_import_forks_nothing_and_its_queued_worker_sees_the_end():
    zygote = Zygote("sm_90a")
    channel = zygote.fork()  # queued: the zygote is still importing
    zygote.kill()
    assert zygote.process.returncode is not None
    assert channel.makefile("rb").read() == b""  # end of file, never a ready message
    channel.close()


def test_a_zygote_that_dies_is_reaped():
    """Killed from outside, or an interpreter that exits at once: no zombie is left."""
    killed = Zygote("sm_90a")
    os.kill(killed.process.pid, signal.SIGKILL)
    wait_until(lambda: process_state(killed.process.pid) is None, 10,
               "the killed zygote was not reaped")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "executable", "/bin/false")
        exited = Zygote("sm_90a")
    wait_until(lambda: process_state(exited.process.pid) is None, 10,
               "the zygote that exited at start was not reaped")
    killed.close()
    exited.close()


def test_a_worker_whose_parent_went_away_exits_quietly():
    """Workers started ahead that nothing needed: the parent exits (or closed their
    sockets) before they said they were ready; each exits without a traceback."""
    control, theirs = socket.socketpair()
    for _ in range(2):
        mine, worker_end = socket.socketpair()
        socket.send_fds(control, [b"w"], [worker_end.fileno()])
        worker_end.close()
        mine.close()  # gone before the zygote forks the worker
    control.close()  # the zygote exits once it has forked them
    # stderr is a pipe the forks share: read to its end, it holds what they said too
    run = subprocess.run([sys.executable, "-c", ZYGOTE_SOURCE, str(theirs.fileno())],
                         pass_fds=[theirs.fileno()], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    theirs.close()
    assert run.returncode == 0 and run.stderr == "", run.stderr[-2000:]


# what a fork runs, in a fresh interpreter with the zygote's environment: its imports, a
# build, then the Inductor modules it holds
AS_A_FORK = textwrap.dedent("""
    import pickle, sys
    from cutedsl_inductor.runtime import zygote
    zygote.preload()
    origin = pickle.load(open(sys.argv[1], "rb")).load().origin
    print(origin, sorted(m for m in sys.modules if m.split(".")[:2] in
                         (["torch", "_inductor"], ["torch", "_dynamo"])))
""")


@pytest.mark.parametrize("cache_dir", ["set", "Inductor's"])
def test_a_workers_imports_and_a_gemm_build_import_no_inductor(graph, tmp_path, monkeypatch,
                                                                cache_dir):
    """Inductor's imports are half of a worker's start (the first op's autotuning waits
    for it); a worker's process compiles a real GEMM kernel into the disk cache the
    requesting process reads (ours set, or under Inductor's cache folder), without them."""
    if cache_dir != "set":
        monkeypatch.setattr(config, "cache_dir", None)
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    a = make_input(graph, "a", (256, 512), torch.bfloat16)
    b = make_input(graph, "b", (512, 384), torch.bfloat16)
    choices = []
    gemm_choices(choices, "mm", [a, b], make_layout((256, 384), torch.bfloat16))
    request = pickle.dumps(worker_builds.build_for(choices[0].bmreq))
    (tmp_path / "build").write_bytes(request)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", CUTE_DSL_ARCH="sm_90a", **{WORKER_ENV: "1"})
    run = subprocess.run([sys.executable, "-c", AS_A_FORK, str(tmp_path / "build")], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["compiled", "[]"]
    assert choices[0].load().origin == "disk"  # what the build left, found here
