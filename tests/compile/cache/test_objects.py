"""Kernels as shared libraries: linked from the exported object when an entry is written,
loaded through TVM-FFI against the runtime library CuTe DSL itself picks; where nothing
links, entries hold the object alone and load through CuTe DSL."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tvm_ffi

from cutedsl_inductor import counters
from cutedsl_inductor.compile.cache import objects
from tests.compile.cache.test_disk_cache import fresh_process_load

ROOT = Path(__file__).resolve().parents[3]


PICKS = """
import json
from cutedsl_inductor.compile.cache import objects
ours = list(objects.runtime_libraries())
from cutlass.runtime import find_runtime_libraries
print(json.dumps([ours, find_runtime_libraries(enable_tvm_ffi=True)]))
"""


@pytest.mark.parametrize("listed", [None, f"/nowhere/libother.so:/somewhere/{objects.RUNTIME}"])
def test_the_runtime_libraries_are_those_cute_dsl_picks(listed):
    """Found without importing CuTe DSL (before it, in a fresh process), in its order:
    ``CUTE_DSL_LIBS``, else the runtime of the toolkit flavor it loads."""
    env = {k: v for k, v in os.environ.items() if k != "CUTE_DSL_LIBS"}
    if listed:
        env["CUTE_DSL_LIBS"] = listed
    run = subprocess.run([sys.executable, "-c", PICKS], cwd=ROOT, env=env, text=True,
                         capture_output=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    ours, cute_dsl = json.loads(run.stdout.splitlines()[-1])
    assert ours == cute_dsl


def test_an_entry_holds_a_library_that_loads_without_cute_dsl(graph, kernel_cache_dir):
    fresh_process_load(graph)
    (library,) = Path(kernel_cache_dir).glob("*/*.so")
    key = library.stem
    manifest = json.loads(library.with_suffix(".json").read_text())
    assert manifest["library_size"] == library.stat().st_size
    _, function = objects.load_library(library.read_bytes(), objects.symbol_for(key))
    assert isinstance(function, tvm_ffi.Function)


@pytest.mark.parametrize("cc", [None, "failing"])
def test_where_nothing_links_entries_hold_the_object_and_load_through_cute_dsl(
        graph, kernel_cache_dir, tmp_path, monkeypatch, caplog, cc):
    """No C compiler on PATH, or one that fails: one warning, and the entries load."""
    if cc == "failing":
        script = tmp_path / "cc"
        script.write_text("#!/bin/sh\necho 'cannot find -lcute_dsl_runtime' >&2\nexit 1\n")
        script.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))  # no cc, gcc or clang but that one
    monkeypatch.setattr(objects, "_WARNED", set())
    fresh_process_load(graph)
    fresh_process_load(graph, threads=256)
    assert caplog.text.count("cached without a shared library (") == 1
    cause = "(no C compiler)" if cc is None else "cc failed: Command"
    assert cause in caplog.text
    assert cc is None or "cannot find -lcute_dsl_runtime" in caplog.text
    assert list(Path(kernel_cache_dir).glob("*/*.so")) == []
    wrapper = fresh_process_load(graph)
    assert counters.kernels.disk_hits == 1 and isinstance(wrapper.kernel_fn, tvm_ffi.Function)
