"""A bounded soak of the compile workers: four precompiles with 2 workers, in each of
which one worker is stopped mid-build (SIGSTOP, as a wedged compiler would stop
answering) and the other killed (SIGKILL); every kernel is built and verifies, and no
process is left (real zygote, real forks, real GPU-less compiles)."""

import os
import signal
import threading
import time

from cutedsl_inductor import config, counters
from cutedsl_inductor.compile import compiler
from cutedsl_inductor.compile.cache.disk_cache import default_cache
from cutedsl_inductor.precompile import precompile
from cutedsl_inductor.runtime import workers
from tests.helpers import children, process_state, wait_until
from tests.runtime.test_workers import add_choices

ROUNDS = 4
TIMEOUT_S = 10  # a build of the add kernel takes 1-3 s in a worker on 2 busy cores


def disrupt(zygote_pid, struck, seconds=120):
    """Once two workers run and one of them is compiling, stop that one and kill the
    other; their pids go into ``struck``. A running fork may also be one the zygote has
    just forked (a round that starts with one worker starts the second ahead, under
    this watch), struck before the pool read it ready: the pool must take that as it
    takes a worker struck later, not as workers that cannot start."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        forks = children(zygote_pid)
        compiling = [pid for pid in forks if process_state(pid) == "R"]
        if len(forks) >= 2 and compiling:
            stopped = compiling[0]
            killed = next(pid for pid in forks if pid != stopped)
            os.kill(stopped, signal.SIGSTOP)
            os.kill(killed, signal.SIGKILL)
            struck += [stopped, killed]
            return
        time.sleep(0.005)


def test_precompiling_while_workers_are_stopped_and_killed(graph, kernel_cache_dir,
                                                           monkeypatch, caplog):
    monkeypatch.setattr(config, "compile_workers", 2)
    (warm,) = add_choices(graph, (32,))  # the zygote's imports, under the default bound
    warm.precompile()
    assert warm.failure is None
    monkeypatch.setattr(config, "compile_worker_timeout_s", TIMEOUT_S)
    zygote_pid = workers.pool().zygote.process.pid
    seen = {zygote_pid}
    try:
        for round_ in range(ROUNDS):
            monkeypatch.setattr(config, "cache_dir", str(kernel_cache_dir / f"round {round_}"))
            compiler._COMPILED.clear()  # each round as a new process
            struck = []
            disruptor = threading.Thread(target=disrupt, args=(zygote_pid, struck))
            disruptor.start()
            summary = precompile("sm_90a", ("elementwise",), progress=False)
            disruptor.join()
            seen.update(struck, children(zygote_pid))
            assert len(struck) == 2, f"round {round_}: no worker was caught compiling"
            assert not summary.failed and summary.compiled + summary.local == 9, str(summary)
            entries = default_cache().entries()
            assert len(entries) == 9 and all(entry["verified"] for entry in entries)
            assert f"(pid {struck[0]}) did not answer within {TIMEOUT_S} s" in caplog.text
            assert counters.kernels.compiled == 0  # every kernel built in a worker
    finally:
        workers.pool().shutdown()
    wait_until(lambda: all(process_state(pid) is None for pid in seen), 30,
               "a worker or the zygote is left")
