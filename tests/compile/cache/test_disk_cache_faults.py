"""Filesystem faults in the kernel cache degrade to compiling, with one warning: the
kernel always comes. Real GPU-less compiles; the read-only and other-user cases run
in a process without root's power over files (``run_unprivileged``)."""

import json
import logging
import os
import shutil
import sys
from pathlib import Path

import pytest

from cutedsl_inductor import config, counters
from cutedsl_inductor.cli import main as cli_main
from cutedsl_inductor.compile import compiler
from tests.compile.cache.test_disk_cache import add_choice, entry_paths, key_of, snapshot
from tests.helpers import run_unprivileged

ROOT = Path(__file__).resolve().parents[3]


def load_fresh(graph, threads=128):
    compiler._COMPILED.clear()
    return add_choice(graph, threads=threads).load()


def cache_warnings(caplog):
    return [r.getMessage() for r in caplog.records
            if r.name.startswith("cutedsl_inductor") and r.levelno >= logging.WARNING]


def test_a_cache_dir_that_is_a_file_compiles_in_memory(graph, tmp_path, monkeypatch, caplog):
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setattr(config, "cache_dir", str(tmp_path / "file"))
    load_fresh(graph, 128)
    load_fresh(graph, 256)
    assert counters.kernels.compiled == 2
    (warning,) = cache_warnings(caplog)
    assert "is not a folder; kernels compile in memory" in warning
    assert (tmp_path / "file").read_text() == "not a folder"


@pytest.mark.parametrize("suffix", [".o", ".so", ".json"])
def test_an_entry_path_that_is_a_directory(graph, kernel_cache_dir, caplog, suffix, capsys):
    choice = add_choice(graph)
    key = key_of(choice)
    path = entry_paths(kernel_cache_dir, key)[0].with_suffix(suffix)
    path.mkdir(parents=True)
    load_fresh(graph)
    warnings = cache_warnings(caplog)
    assert any("could not store a kernel" in w for w in warnings)
    load_fresh(graph)  # the entry cannot be stored: compiled again, no more warnings
    assert counters.kernels.compiled == 2 and cache_warnings(caplog) == warnings
    assert cli_main(["cache", "clear"]) == 0  # and clear passes it by
    assert path.is_dir()


def test_a_lock_that_is_a_symlink_is_not_followed(graph, kernel_cache_dir, tmp_path, caplog):
    choice = add_choice(graph)
    choice.load()
    lock = entry_paths(kernel_cache_dir, key_of(choice))[0].with_suffix(".lock")
    target = tmp_path / "someone_elses_file"
    target.write_text("keep me")
    lock.unlink()
    lock.symlink_to(target)
    load_fresh(graph)
    assert counters.kernels.disk_hits == 1  # verified and loaded without the lock
    (warning,) = cache_warnings(caplog)
    assert "could not lock an entry" in warning
    assert target.read_text() == "keep me" and lock.is_symlink()


def test_an_untrusted_secret_turns_the_cache_off(graph, kernel_cache_dir, caplog):
    from cutedsl_inductor.compile.cache import disk_cache

    load_fresh(graph)
    (kernel_cache_dir / "secret").chmod(0o666)
    disk_cache._cache_for.cache_clear()  # opened anew, as by a new process
    load_fresh(graph)
    assert counters.kernels.compiled == 2 and counters.kernels.disk_hits == 0
    (warning,) = cache_warnings(caplog)
    assert "untrusted secret (writable by every user" in warning


# -- without root's power over files ---------------------------------------------

LOAD_STEPS = """
import json, logging, sys, torch, torch.fx
from torch._inductor.graph import GraphLowering
from torch._inductor.virtualized import V
from cutedsl_inductor import config, counters
from cutedsl_inductor.compile import compiler
from tests.compile.cache.test_disk_cache import add_choice

warnings = []
handler = logging.Handler(logging.WARNING)
handler.emit = lambda record: warnings.append(record.getMessage())
logging.getLogger("cutedsl_inductor").addHandler(handler)
results = []
graph = GraphLowering(torch.fx.symbolic_trace(lambda x: x))
with V.set_graph_handler(graph):
    for cache_dir, threads in json.loads(sys.argv[1]):
        before, warnings[:] = counters.snapshot()["kernels"], []
        with config.patch(cache_dir=cache_dir):
            for t in threads:
                compiler._COMPILED.clear()
                add_choice(graph, threads=t).load()
        results.append({"compiled": counters.kernels.compiled - before["compiled"],
                        "disk_hits": counters.kernels.disk_hits - before["disk_hits"],
                        "warnings": list(warnings)})
print(json.dumps(results))
"""


def load_unprivileged(tmp_path, steps):
    """Run ``steps`` ([cache dir, [THREADS, ...]], ...) in a fresh unprivileged process:
    per step, how many kernels it compiled and loaded, and its warnings."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    run = run_unprivileged([sys.executable, "-c", LOAD_STEPS, json.dumps(steps)], cwd=ROOT,
                           env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.splitlines()[-1])


def fill(graph, cache_dir, threads):
    with config.patch(cache_dir=str(cache_dir)):
        for t in threads:
            load_fresh(graph, t)


def chmod_tree(root, dirs, files):
    for path in [root, *root.rglob("*")]:
        path.chmod(dirs if path.is_dir() else files)


def test_a_read_only_cache_serves_its_entries_and_compiles_the_rest(graph, tmp_path):
    shared, bare = tmp_path / "shared", tmp_path / "bare"
    fill(graph, shared, (128, 256))
    shutil.copytree(shared, bare)
    (bare / "secret").unlink()
    for root in (shared, bare):
        chmod_tree(root, 0o555, 0o444)
    (shared / "secret").chmod(0o400)
    before = snapshot(shared)
    loads, missing, unverifiable = load_unprivileged(
        tmp_path, [[str(shared), [128, 256]], [str(shared), [512]], [str(bare), [128]]])
    assert (loads["compiled"], loads["disk_hits"]) == (0, 2)
    (warning,) = loads["warnings"]
    assert "is not writable: used read-only" in warning
    assert (missing["compiled"], missing["warnings"]) == (1, [])  # in memory
    assert unverifiable["compiled"] == 1
    (warning,) = unverifiable["warnings"]
    assert "has no secret, so its entries cannot be verified" in warning
    assert snapshot(shared) == before


@pytest.mark.skipif(os.geteuid() != 0, reason="making files of another user needs root")
def test_entries_and_caches_of_another_user(graph, tmp_path):
    theirs, readable, private = (tmp_path / name for name in ("theirs", "readable", "private"))
    fill(graph, theirs, (128,))
    shutil.copytree(theirs, readable)
    shutil.copytree(theirs, private)
    for path in theirs.rglob("*"):  # their entries, in this user's cache
        if path.is_file() and path.name != "secret":
            os.chown(path, 12345, 12345)
    for root, mode in ((readable, 0o644), (private, 0o600)):  # their caches
        chmod_tree(root, 0o755, mode)
        for path in [root, *root.rglob("*")]:
            os.chown(path, 12345, 12345)
    rebuilt, again, shared, refused = load_unprivileged(
        tmp_path, [[str(theirs), [128]], [str(theirs), [128]], [str(readable), [128]],
                   [str(private), [128]]])
    assert rebuilt["compiled"] == 1 and rebuilt["warnings"]
    assert again["compiled"] + again["disk_hits"] == 1 and not again["warnings"]
    assert (shared["compiled"], shared["disk_hits"]) == (0, 1)
    (warning,) = shared["warnings"]
    assert "belongs to uid 65534, not to this user: used read-only" in warning
    assert refused["compiled"] == 1
    (warning,) = refused["warnings"]
    assert "cannot be used: its secret: PermissionError" in warning
