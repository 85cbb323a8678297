"""The on-disk kernel cache, with real GPU-less compiles of the add template."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cutedsl_inductor import config
from cutedsl_inductor.compile import compiler
from cutedsl_inductor.compile.disk_cache import default_cache
from cutedsl_inductor.templates.elementwise import add_template
from tests.helpers import make_input, make_layout


def add_choice(graph, threads=128, shape=(64, 128)):
    inputs = [make_input(graph, "arg0_1", shape), make_input(graph, "arg1_1", shape)]
    return add_template.generate(input_nodes=inputs, layout=make_layout(shape),
                                 THREADS=threads, VECTOR=4)


def fresh_process_load(graph, **kwargs):
    """Load as a new process would: nothing compiled in memory yet."""
    compiler._COMPILED.clear()
    return add_choice(graph, **kwargs).load()


def entry_files(cache_dir):
    return sorted(p.name for p in Path(cache_dir).glob("*/*") if p.suffix in (".o", ".json"))


def test_miss_compiles_and_stores_then_a_new_process_loads(graph, kernel_cache_dir):
    fresh_process_load(graph)
    assert compiler.stats["compiled"] == 1
    (manifest,) = default_cache().entries()
    assert manifest["template"] == "elementwise_add" and manifest["arch"] == "sm_90a"
    assert manifest["params"] == {"THREADS": "128", "VECTOR": "4"}
    fresh_process_load(graph)
    assert (compiler.stats["compiled"], compiler.stats["disk_hits"]) == (1, 1)


def test_same_process_reuses_the_compiled_function(graph):
    first = add_choice(graph).load()
    second = add_choice(graph).load()
    assert first.kernel_fn is second.kernel_fn
    assert compiler.stats["compiled"] == 1


@pytest.mark.parametrize("change", ["arch", "versions", "params", "options"])
def test_key_changes_rebuild(graph, monkeypatch, change):
    fresh_process_load(graph)
    if change == "arch":
        monkeypatch.setattr(config, "arch", "sm_100a")
    elif change == "versions":
        versions = {**compiler.toolchain_versions(), "nvidia-cutlass-dsl": "9.9.9"}
        monkeypatch.setattr(compiler, "toolchain_versions", lambda: versions)
    elif change == "options":
        monkeypatch.setattr(config, "compile_options", "--opt-level 2")
    kwargs = {"threads": 256} if change == "params" else {}
    fresh_process_load(graph, **kwargs)
    assert compiler.stats["compiled"] == 2
    assert len(default_cache().entries()) == 2


def test_an_edit_to_the_package_sources_changes_the_versions_in_every_key(tmp_path):
    """Generated modules import the package's kernels (the GEMM body is sm90_gemm.py, not
    in the rendered source): editing one must change the versions every key hashes."""
    import shutil

    package = Path(compiler.__file__).resolve().parents[1]
    assert compiler.toolchain_versions()["cutedsl_inductor sources"] == \
        compiler.source_tree_hash(package)
    copy = tmp_path / "cutedsl_inductor"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = compiler.source_tree_hash(copy)
    kernel = copy / "templates" / "gemm" / "sm90_gemm.py"
    kernel.write_text(kernel.read_text() + "\n# an edit\n")
    assert compiler.source_tree_hash(copy) != before


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage_manifest", "foreign", "no_object"])
def test_unusable_entries_are_removed_and_rebuilt(graph, kernel_cache_dir, caplog, damage):
    fresh_process_load(graph)
    (obj,) = Path(kernel_cache_dir).glob("*/*.o")
    manifest = obj.with_suffix(".json")
    if damage == "truncate":
        obj.write_bytes(obj.read_bytes()[:100])
    elif damage == "flip":
        data = bytearray(obj.read_bytes())
        data[len(data) // 2] ^= 0xFF
        obj.write_bytes(bytes(data))
    elif damage == "garbage_manifest":
        manifest.write_text("{not json")
    elif damage == "foreign":
        fields = json.loads(manifest.read_text())
        manifest.write_text(json.dumps({**fields, "key": "0" * 64}))
    else:
        obj.unlink()
    fresh_process_load(graph)
    assert compiler.stats["compiled"] == 2 and compiler.stats["disk_hits"] == 0
    assert "removing unusable CuteDSL cache entry" in caplog.text
    fresh_process_load(graph)
    assert compiler.stats["disk_hits"] == 1


CONCURRENT_SCRIPT = textwrap.dedent("""
    import sys, torch, torch.fx
    from torch._inductor.graph import GraphLowering
    from torch._inductor.virtualized import V
    from cutedsl_inductor.compile import compiler
    from tests.compile.test_disk_cache import add_choice
    g = GraphLowering(torch.fx.symbolic_trace(lambda x: x))
    with V.set_graph_handler(g):
        add_choice(g).load()
    print(compiler.stats["compiled"], compiler.stats["disk_hits"])
""")


def test_processes_compiling_the_same_kernel_at_once_compile_it_once(kernel_cache_dir):
    root = Path(__file__).resolve().parents[2]
    env = {**__import__("os").environ, "CUTEDSL_INDUCTOR_CACHE_DIR": str(kernel_cache_dir)}
    procs = [subprocess.Popen([sys.executable, "-c", CONCURRENT_SCRIPT], cwd=root, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    results = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in results]
    counts = [tuple(map(int, out.split()[-2:])) for out, _ in results]
    assert sum(c for c, _ in counts) == 1
    assert sum(h for _, h in counts) == 2
    assert len(entry_files(kernel_cache_dir)) == 2
