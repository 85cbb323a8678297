"""Compiling in worker processes: real spawned workers, real GPU-less compiles."""

import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from cutedsl_inductor import CuteDSLTemplate, config, counters
from cutedsl_inductor.compile import compiler
from cutedsl_inductor.exc import CompileWorkerError, KernelCompileError
from cutedsl_inductor.kernels.elementwise import add_template
from cutedsl_inductor.runtime import worker_builds, workers
from tests.helpers import (
    children,
    make_input,
    make_layout,
    process_state,
    wait_until,
    zombie_children,
)
from tests.runtime.test_loader import BROKEN_SOURCE


@pytest.fixture
def two_workers(monkeypatch):
    """Two compile workers (the test's own pool: ``conftest.py``)."""
    monkeypatch.setattr(config, "compile_workers", 2)


def add_choices(graph, threads):
    inputs = [make_input(graph, "arg0_1", (64, 128)), make_input(graph, "arg1_1", (64, 128))]
    return [add_template.generate(input_nodes=inputs, layout=make_layout((64, 128)),
                                  THREADS=t, VECTOR=4) for t in threads]


def test_workers_compile_what_inductors_threads_precompile(graph, two_workers):
    choices = add_choices(graph, (64, 128, 256))
    with ThreadPoolExecutor(3) as pool:  # as Inductor's precompile does
        list(pool.map(lambda choice: choice.precompile(), choices))
    assert [c.failure for c in choices] == [None, None, None]
    # this process compiled nothing: it loaded what the workers left in the disk cache
    assert counters.kernels.compiled == 0 and counters.kernels.disk_hits == 3


def test_workers_fetch_from_and_publish_to_the_remote_tier_set_here(graph, two_workers,
                                                                    remote_redis, tmp_path,
                                                                    monkeypatch):
    """The remote tier set by assignment, not in the environment the workers inherit:
    their requests carry it."""
    choices = add_choices(graph, (64, 128))
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda choice: choice.precompile(), choices))
    assert len(remote_redis.keys()) == 2  # published by the workers
    # another machine: its own disk cache, nothing in its processes' memory
    monkeypatch.setattr(config, "cache_dir", str(tmp_path / "another machine"))
    compiler._COMPILED.clear()
    workers.pool().shutdown()
    assert [workers.pool().build(c.bmreq) for c in add_choices(graph, (64, 128))] == [
        "remote", "remote"]


def test_a_worker_builds_into_the_cache_asked_for_not_from_its_memory(graph, two_workers,
                                                                    tmp_path, monkeypatch):
    """The same kernel asked for in another cache folder (this process forgot it): the
    worker that built it before stores it there too, so nothing compiles here."""
    monkeypatch.setattr(config, "compile_workers", 1)  # the same worker, both times
    (choice,) = add_choices(graph, (64,))
    assert workers.pool().build(choice.bmreq) == "compiled"
    monkeypatch.setattr(config, "cache_dir", str(tmp_path / "another cache"))
    compiler._COMPILED.clear()
    (again,) = add_choices(graph, (64,))
    assert workers.pool().build(again.bmreq) == "compiled"
    assert again.load().origin == "disk" and counters.kernels.compiled == 0


def test_a_kernel_already_built_goes_to_no_worker(graph, monkeypatch):
    (first,) = add_choices(graph, (128,))
    first.load()  # compiled here, no workers
    monkeypatch.setattr(config, "compile_workers", 2)
    (again,) = add_choices(graph, (128,))
    again.precompile()
    assert workers.pool().running == 0 and again.failure is None


@pytest.mark.skipif(os.geteuid() != 0, reason="making a folder of another user needs root")
def test_a_cache_used_read_only_sends_nothing_to_workers(graph, two_workers, kernel_cache_dir):
    """What a worker compiled could not be stored there: this process compiles it."""
    kernel_cache_dir.mkdir()
    os.chown(kernel_cache_dir, 12345, 12345)
    (choice,) = add_choices(graph, (128,))
    choice.precompile()
    assert choice.failure is None and workers.pool().running == 0
    assert counters.kernels.compiled == 1


def test_a_compile_error_in_a_worker_comes_back_in_full(graph, two_workers):
    template = CuteDSLTemplate("broken_in_worker", BROKEN_SOURCE)
    inputs = [make_input(graph, "arg0_1", (64, 128)), make_input(graph, "arg1_1", (64, 128))]
    choice = template.generate(input_nodes=inputs, layout=make_layout((64, 128)), TILE=16)
    choice.precompile()
    assert isinstance(choice.failure, KernelCompileError)
    message = str(choice.failure)
    assert "'broken_in_worker'" in message and "TILE=16" in message and ".py" in message
    assert counters.kernels.compiled == 0  # not compiled again here


DYING_SOURCE = r'''
import os
os._exit(3)  # the process that imports this module dies
{{gen_defines()}}

@cute.jit
{{def_kernel("a", "b")}}
    pass
'''


def test_a_kernel_that_kills_every_worker_is_dropped_and_they_are_replaced(graph, two_workers):
    inputs = [make_input(graph, "arg0_1", (64, 128)), make_input(graph, "arg1_1", (64, 128))]
    dying = CuteDSLTemplate("dies_in_worker", DYING_SOURCE).generate(
        input_nodes=inputs, layout=make_layout((64, 128)), TILE=8)
    dying.precompile()
    assert isinstance(dying.failure, CompileWorkerError)
    assert "'dies_in_worker'" in str(dying.failure) and "TILE=8" in str(dying.failure)
    (healthy,) = add_choices(graph, (64,))
    healthy.precompile()
    assert healthy.failure is None and counters.kernels.disk_hits == 1


# the first worker that builds it (or every one, without a marker) stops itself, as a
# wedged compiler would stop answering; it writes its pid to the pids file first
STOPPING_PREFIX = """
import os, signal
if os.environ.get("CUDA_VISIBLE_DEVICES") == "" and not os.path.exists({marker!r}):
    with open({pids!r}, "a") as pids:
        pids.write(f"{{os.getpid()}}\\n")
    if {once!r}:
        open({marker!r}, "w").close()
    os.kill(os.getpid(), signal.SIGSTOP)
"""


def stopping_choice(graph, tmp_path, name, once):
    from cutedsl_inductor.kernels.elementwise import ADD_SOURCE

    prefix = STOPPING_PREFIX.format(marker=str(tmp_path / "stopped once"),
                                    pids=str(tmp_path / "pids"), once=once)
    inputs = [make_input(graph, "arg0_1", (64, 128)), make_input(graph, "arg1_1", (64, 128))]
    return CuteDSLTemplate(name, prefix + ADD_SOURCE).generate(
        input_nodes=inputs, layout=make_layout((64, 128)), THREADS=128, VECTOR=4)


def stopped_pids(tmp_path):
    return [int(line) for line in (tmp_path / "pids").read_text().split()]


@pytest.fixture
def short_timeout(graph, two_workers, monkeypatch):
    """Two workers ready (their zygote's imports took the default time), then a 3 s bound."""
    (warm,) = add_choices(graph, (32,))
    warm.precompile()
    assert warm.failure is None
    monkeypatch.setattr(config, "compile_worker_timeout_s", 3)


def test_a_worker_that_stops_answering_is_killed_and_its_kernel_built_in_another(
        graph, short_timeout, tmp_path, caplog):
    choice = stopping_choice(graph, tmp_path, "stops_in_a_worker_once", once=True)
    start = time.monotonic()
    choice.precompile()
    assert choice.failure is None and time.monotonic() - start < 60
    assert counters.kernels.compiled == 0  # built in the other worker, loaded from disk
    (stopped,) = stopped_pids(tmp_path)
    assert caplog.text.count(f"(pid {stopped}) did not answer within 3 s") == 1
    wait_until(lambda: process_state(stopped) is None, 10, "the stopped worker is still there")


def test_a_kernel_that_stops_every_worker_is_dropped(graph, short_timeout, tmp_path):
    choice = stopping_choice(graph, tmp_path, "stops_every_worker", once=False)
    choice.precompile()
    assert isinstance(choice.failure, CompileWorkerError)
    assert "in a second worker too" in str(choice.failure) and "3 s" in str(choice.failure)
    assert counters.kernels.compiled == 0  # not tried here, where it would hang this process
    for pid in stopped_pids(tmp_path):
        wait_until(lambda: process_state(pid) is None, 10, "a stopped worker is still there")


def test_workers_struck_before_the_pool_read_them_ready_are_replaced(graph, two_workers,
                                                                     monkeypatch, caplog):
    """Two workers started ahead, one killed and one stopped as soon as the zygote forks
    them, before the pool read their ready messages: the build still runs in a worker
    (the workers are not turned off as ones that cannot start), and no struck process is
    left."""
    (choice,) = add_choices(graph, (64,))  # starts both workers ahead
    zygote = workers.pool().zygote.process.pid
    wait_until(lambda: len(children(zygote)) == 2, 300, "the zygote forked no workers")
    killed, stopped = children(zygote)
    os.kill(killed, signal.SIGKILL)
    os.kill(stopped, signal.SIGSTOP)
    # a fork of a process with torch imported takes a while to exit (its memory first)
    wait_until(lambda: process_state(killed) is None, 10, "the killed worker did not exit")
    assert workers.pool().idle == 2  # neither read as ready yet
    monkeypatch.setattr(config, "compile_worker_timeout_s", 6)
    choice.precompile()
    assert choice.failure is None and counters.kernels.compiled == 0  # built in a worker
    assert workers.pool().cannot_start is None and workers.pool().running == 1
    assert f"(pid {killed}) exited before it was given a build" in caplog.text
    assert f"(pid {stopped}) did not answer within 6 s" in caplog.text
    wait_until(lambda: process_state(stopped) is None, 10, "the stopped worker is still there")


def test_a_worker_failing_for_its_own_reasons_leaves_the_compile_to_this_process(
        graph, two_workers, caplog):
    from cutedsl_inductor.kernels.elementwise import ADD_SOURCE

    source = ('import os\nif os.environ.get("CUDA_VISIBLE_DEVICES") == "":\n'
              '    raise RuntimeError("only in a worker")\n' + ADD_SOURCE)
    inputs = [make_input(graph, "arg0_1", (64, 128)), make_input(graph, "arg1_1", (64, 128))]
    choice = CuteDSLTemplate("fails_in_worker_only", source).generate(
        input_nodes=inputs, layout=make_layout((64, 128)), THREADS=128, VECTOR=4)
    choice.precompile()
    assert choice.failure is None and counters.kernels.compiled == 1
    assert "only in a worker" in caplog.text and "compiling it in this process" in caplog.text


def test_upstream_style_entries_go_to_no_worker(graph, two_workers):
    from cutedsl_inductor.kernels.elementwise import UPSTREAM_ADD_SOURCE

    inputs = [make_input(graph, "arg0_1", (64, 128)), make_input(graph, "arg1_1", (64, 128))]
    choice = CuteDSLTemplate("upstream_in_workers", UPSTREAM_ADD_SOURCE).generate(
        input_nodes=inputs, layout=make_layout((64, 128)), THREADS_PER_BLOCK=128)
    choice.precompile()
    assert choice.failure is None and workers.pool().running == 0


def test_workers_that_cannot_start_leave_every_compile_to_this_process(
        graph, two_workers, monkeypatch, caplog):
    monkeypatch.setattr(sys, "executable", "/bin/false")  # an interpreter that cannot run them
    first, second = add_choices(graph, (64, 128))
    first.precompile()
    second.precompile()
    assert first.failure is None and second.failure is None
    assert counters.kernels.compiled == 2  # here
    assert caplog.text.count("compile workers cannot start") == 1
    wait_until(lambda: not zombie_children(), 10, "a dead zygote was not reaped")


def test_two_pools_share_nothing_and_a_shutdown_leaves_no_process(graph, monkeypatch):
    """A pool whose workers cannot start turns itself off, not another; shutting one
    down stops none of another's processes, and the other's shutdown ends its own."""
    first, second = add_choices(graph, (64, 128))  # made without workers: none start ahead
    monkeypatch.setattr(config, "compile_workers", 2)
    broken, working = workers.WorkerPool(), workers.WorkerPool()
    with monkeypatch.context() as patch:
        patch.setattr(sys, "executable", "/bin/false")  # an interpreter that cannot run them
        assert broken.build(first.bmreq) is None
    assert broken.cannot_start is not None and working.cannot_start is None
    assert working.build(first.bmreq) == "compiled"
    zygote = working.zygote
    broken.shutdown()
    assert working.build(second.bmreq) == "compiled" and working.zygote is zygote
    processes = [zygote.process.pid, *children(zygote.process.pid)]
    assert len(processes) == 2 and working.running == 1  # the idle worker built both
    assert workers.pool().zygote is None and workers.pool().cannot_start is None
    working.shutdown()
    wait_until(lambda: all(process_state(pid) is None for pid in processes), 30,
               "a worker or the zygote is left")


def wait_until_built(choices, seconds=180):
    deadline = time.monotonic() + seconds
    while any(worker_builds.key_to_build(c.bmreq, False) is not None for c in choices):
        assert time.monotonic() < deadline, "the prefetched kernels were not built"
        time.sleep(0.2)


def test_prefetched_choices_build_when_made_and_their_precompile_loads_them(
        graph, two_workers, monkeypatch):
    monkeypatch.setattr(config, "compile_prefetch", True)
    choices = add_choices(graph, (64, 128, 256))
    wait_until_built(choices)  # nobody asked for them yet
    with ThreadPoolExecutor(3) as pool:
        list(pool.map(lambda choice: choice.precompile(), choices))
    assert [c.failure for c in choices] == [None, None, None]
    assert counters.kernels.compiled == 0 and counters.kernels.disk_hits == 3


def test_without_prefetch_a_made_choice_builds_nothing(graph, two_workers):
    (choice,) = add_choices(graph, (64,))
    time.sleep(1.0)
    assert worker_builds.key_to_build(choice.bmreq, False) is not None


def test_a_build_under_way_is_waited_for_not_started_again(graph, two_workers):
    (choice,) = add_choices(graph, (128,))
    start = threading.Barrier(2)

    def build():
        start.wait()
        return workers.pool().build(choice.bmreq)

    with ThreadPoolExecutor(2) as pool:
        replies = list(pool.map(lambda _: build(), range(2)))
    assert sorted(replies, key=str) == [None, "compiled"]  # one worker built it, once
    choice.load()
    assert counters.kernels.compiled == 0 and counters.kernels.disk_hits == 1


def test_a_prefetch_whose_knobs_changed_is_dropped(graph, two_workers, monkeypatch):
    (choice,) = add_choices(graph, (256,))
    monkeypatch.setattr(config, "compile_prefetch", True)
    with config.patch(compile_options="--opt-level 2"):  # not the choice's any more
        workers.pool().prefetch(choice.bmreq)
        time.sleep(1.0)
    monkeypatch.setattr(config, "compile_prefetch", False)
    assert worker_builds.key_to_build(choice.bmreq, False) is not None


def test_the_first_choice_to_build_starts_the_workers_ahead(graph, two_workers):
    """Without prefetch nothing builds when a choice is made, but the workers start then,
    and the precompile that follows uses them."""
    first, second = add_choices(graph, (64, 128))
    assert workers.pool().running == 2 and workers.pool().idle == 2
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda choice: choice.precompile(), (first, second)))
    assert [first.failure, second.failure] == [None, None]
    assert workers.pool().running == 2  # the same two workers built both
    assert counters.kernels.compiled == 0 and counters.kernels.disk_hits == 2
    # what they cost, as the first-call breakdown reports it
    stats = counters.workers
    assert stats.started == 2 and stats.builds == 2
    assert stats.startup_s > 0 and stats.build_s > 0 and stats.ready_wait_s >= 0


def test_a_choice_already_built_starts_no_worker(graph, monkeypatch):
    (first,) = add_choices(graph, (128,))
    first.load()  # compiled here, no workers
    monkeypatch.setattr(config, "compile_workers", 2)
    add_choices(graph, (128,))
    assert workers.pool().running == 0
