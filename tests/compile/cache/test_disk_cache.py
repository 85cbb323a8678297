"""The on-disk kernel cache, with real GPU-less compiles of the add template: entries,
their integrity against damage and forgery, ``cache clear``."""

import hashlib
import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from cutedsl_inductor import config, counters
from cutedsl_inductor.cli import main as cli_main
from cutedsl_inductor.compile import compiler, versions
from cutedsl_inductor.compile.cache.disk_cache import default_cache
from cutedsl_inductor.kernels.elementwise import add_template
from cutedsl_inductor.runtime.loader import kernel_key
from tests.helpers import make_input, make_layout


def add_choice(graph, threads=128, shape=(64, 128), dtype=torch.float32):
    inputs = [make_input(graph, "arg0_1", shape, dtype), make_input(graph, "arg1_1", shape, dtype)]
    return add_template.generate(input_nodes=inputs, layout=make_layout(shape, dtype),
                                 THREADS=threads, VECTOR=4)


def key_of(choice):
    return kernel_key(choice.kernel)


def fresh_process_load(graph, **kwargs):
    """Load as a new process would: nothing compiled in memory yet."""
    compiler._COMPILED.clear()
    return add_choice(graph, **kwargs).load()


def entry_files(cache_dir):
    return sorted(p.name for p in Path(cache_dir).glob("*/*") if p.suffix in (".o", ".json"))


def test_miss_compiles_and_stores_then_a_new_process_loads(graph, kernel_cache_dir):
    fresh_process_load(graph)
    assert counters.kernels.compiled == 1
    (manifest,) = default_cache().entries()
    assert manifest["template"] == "elementwise_add" and manifest["arch"] == "sm_90a"
    assert manifest["params"] == {"THREADS": "128", "VECTOR": "4"}
    fresh_process_load(graph)
    assert (counters.kernels.compiled, counters.kernels.disk_hits) == (1, 1)


def test_same_process_reuses_the_compiled_function(graph):
    first = add_choice(graph).load()
    second = add_choice(graph).load()
    assert first.kernel_fn is second.kernel_fn
    assert counters.kernels.compiled == 1


@pytest.mark.parametrize("change", ["arch", "versions", "params", "options"])
def test_key_changes_rebuild(graph, monkeypatch, change):
    fresh_process_load(graph)
    if change == "arch":
        monkeypatch.setattr(config, "arch", "sm_100a")
    elif change == "versions":
        forged = {**versions.toolchain_versions(), "nvidia-cutlass-dsl": "9.9.9"}
        monkeypatch.setattr(versions, "toolchain_versions", lambda: forged)
    elif change == "options":
        monkeypatch.setattr(config, "compile_options", "--opt-level 2")
    kwargs = {"threads": 256} if change == "params" else {}
    fresh_process_load(graph, **kwargs)
    assert counters.kernels.compiled == 2
    assert len(default_cache().entries()) == 2


def test_an_edit_to_the_package_sources_changes_the_versions_in_every_key(tmp_path):
    """Generated modules import the package's kernels (the GEMM body is sm90_gemm.py, not
    in the rendered source): editing one must change the versions every key hashes."""
    import shutil

    package = Path(compiler.__file__).resolve().parents[1]
    assert versions.toolchain_versions()["cutedsl_inductor sources"] == \
        versions.source_tree_hash(package)
    copy = tmp_path / "cutedsl_inductor"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = versions.source_tree_hash(copy)
    kernel = copy / "kernels" / "gemm" / "sm90_gemm.py"
    kernel.write_text(kernel.read_text() + "\n# an edit\n")
    assert versions.source_tree_hash(copy) != before


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage_manifest", "foreign", "no_object",
                                    "truncate_library", "flip_library", "no_library"])
def test_unusable_entries_are_removed_and_rebuilt(graph, kernel_cache_dir, caplog, damage):
    fresh_process_load(graph)
    (obj,) = Path(kernel_cache_dir).glob("*/*.o")
    manifest = obj.with_suffix(".json")
    damaged = obj.with_suffix(".so") if damage.endswith("library") else obj
    if damage.startswith("truncate"):
        damaged.write_bytes(damaged.read_bytes()[:100])
    elif damage.startswith("flip"):
        data = bytearray(damaged.read_bytes())
        data[len(data) // 2] ^= 0xFF
        damaged.write_bytes(bytes(data))
    elif damage == "garbage_manifest":
        manifest.write_text("{not json")
    elif damage == "foreign":
        fields = json.loads(manifest.read_text())
        manifest.write_text(json.dumps({**fields, "key": "0" * 64}))
    else:
        damaged.unlink()
    fresh_process_load(graph)
    assert counters.kernels.compiled == 2 and counters.kernels.disk_hits == 0
    assert "removing unusable CuteDSL cache entry" in caplog.text
    fresh_process_load(graph)
    assert counters.kernels.disk_hits == 1


CONCURRENT_SCRIPT = textwrap.dedent("""
    import sys, torch, torch.fx
    from torch._inductor.graph import GraphLowering
    from torch._inductor.virtualized import V
    from cutedsl_inductor import counters
    from tests.compile.cache.test_disk_cache import add_choice
    g = GraphLowering(torch.fx.symbolic_trace(lambda x: x))
    with V.set_graph_handler(g):
        add_choice(g).load()
    print(counters.kernels.compiled, counters.kernels.disk_hits)
""")


def test_processes_compiling_the_same_kernel_at_once_compile_it_once(kernel_cache_dir):
    root = Path(__file__).resolve().parents[3]
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


def entry_paths(cache_dir, key):
    folder = Path(cache_dir) / key[:2]
    return folder / f"{key}.o", folder / f"{key}.json"


@pytest.mark.parametrize("forgery", ["swapped_object", "edited_object", "renamed_entry",
                                     "swapped_library", "edited_library"])
def test_a_forged_entry_never_loads(graph, kernel_cache_dir, caplog, forgery):
    """Its manifest edited to match (size, sha256 of the object or of the library), as
    one who can write the cache but not read its secret would: the seal, or the key it
    binds, gives it away."""
    fp16 = add_choice(graph, threads=256, dtype=torch.float16)
    bf16 = add_choice(graph, threads=128, dtype=torch.bfloat16)
    for choice in (fp16, bf16):
        compiler._COMPILED.clear()
        choice.load()
    (obj, manifest), (other_obj, other_manifest) = (entry_paths(kernel_cache_dir, key_of(c))
                                                    for c in (fp16, bf16))
    if forgery == "renamed_entry":
        for suffix in (".o", ".so"):
            obj.with_suffix(suffix).write_bytes(other_obj.with_suffix(suffix).read_bytes())
        manifest.write_bytes(other_manifest.read_bytes())
    else:
        suffix = ".so" if forgery.endswith("library") else ".o"
        target = obj.with_suffix(suffix)
        data = bytearray((target if forgery.startswith("edited")
                          else other_obj.with_suffix(suffix)).read_bytes())
        if forgery.startswith("edited"):
            data[len(data) // 2] ^= 0xFF
        target.write_bytes(bytes(data))
        fields = json.loads(manifest.read_text())
        prefix = "library_" if suffix == ".so" else ""
        fields.update({f"{prefix}size": len(data),
                       f"{prefix}sha256": hashlib.sha256(data).hexdigest()})
        manifest.write_text(json.dumps(fields))
    compiler._COMPILED.clear()
    add_choice(graph, threads=256, dtype=torch.float16).load()
    assert counters.kernels.compiled == 3 and counters.kernels.disk_hits == 0
    reason = "key differs" if forgery == "renamed_entry" else "seal does not verify"
    assert "removing unusable CuteDSL cache entry" in caplog.text and reason in caplog.text


@pytest.mark.parametrize("via", ["library", "object"])
def test_the_bytes_verified_are_the_bytes_loaded(graph, kernel_cache_dir, monkeypatch, caplog,
                                                 via):
    """The loader gets a private copy of what was read and checked, never the path an
    attacker could swap in between: the library's (TVM-FFI) or, where that does not
    load, the object's (CuTe DSL), with one warning."""
    import cutlass.cute as cute
    import tvm_ffi

    choice = add_choice(graph)
    choice.load()
    obj, _ = entry_paths(kernel_cache_dir, key_of(choice))
    loaded = []

    def recording(real_load):
        def load(path, **kwargs):
            loaded.append((Path(path), Path(path).read_bytes(),
                           stat.S_IMODE(os.stat(Path(path).parent).st_mode)))
            return real_load(path, **kwargs)
        return load

    def refusing(path, **kwargs):
        raise RuntimeError("no such library here")

    monkeypatch.setattr(cute.runtime, "load_module", recording(cute.runtime.load_module))
    monkeypatch.setattr(tvm_ffi, "load_module",
                        recording(tvm_ffi.load_module) if via == "library" else refusing)
    fresh_process_load(graph)
    assert counters.kernels.disk_hits == 1
    ((path, data, folder_mode),) = loaded
    assert kernel_cache_dir not in path.parents and folder_mode == 0o700
    assert data == obj.with_suffix(".so" if via == "library" else ".o").read_bytes()
    assert not path.exists()
    fell_back = "could not load a kernel's shared library (RuntimeError: no such library"
    assert (fell_back in caplog.text) == (via == "object")


def test_the_cache_is_private_under_umask_000(graph, kernel_cache_dir):
    old = os.umask(0)
    try:
        fresh_process_load(graph)
    finally:
        os.umask(old)
    paths = [kernel_cache_dir, *kernel_cache_dir.rglob("*")]
    assert len(paths) == 7  # the root, secret, a folder, the entry's .o, .so, .json, .lock
    for path in paths:
        assert stat.S_IMODE(path.stat().st_mode) == (0o700 if path.is_dir() else 0o600), path


def snapshot(root):
    """path -> (kind, content or link target, mtime) for everything under ``root``."""
    found = {}
    for path in [root, *root.rglob("*")]:
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):
            found[path] = ("link", os.readlink(path), info.st_mtime_ns)
        elif stat.S_ISDIR(info.st_mode):
            found[path] = ("dir", None, info.st_mtime_ns)
        else:
            found[path] = ("file", path.read_bytes(), info.st_mtime_ns)
    return found


def test_clear_removes_only_what_the_cache_wrote(graph, kernel_cache_dir, tmp_path, capsys):
    choice = add_choice(graph)
    choice.load()
    key = key_of(choice)
    other = "ee" + key[2:]
    outside = tmp_path / "outside"
    (outside / "deeper").mkdir(parents=True)
    for name in ("settings.json", "lib.o", f"{other}.json", f"{other}.o", "deeper/x.json"):
        (outside / name).write_text(f"theirs: {name}")
    (kernel_cache_dir / "ee").symlink_to(outside)  # a subfolder linked elsewhere
    folder = kernel_cache_dir / key[:2]
    planted = [folder / "notes.json", folder / "x.o", folder / ".x.tmp", kernel_cache_dir / "lib.o"]
    for path in planted:
        path.write_text("not the cache's")
    (folder / f"{key[:2]}{'0' * 62}.json").mkdir()  # key-named, but a directory
    (folder / f"{key[:2]}{'1' * 62}.o").symlink_to(outside / "lib.o")
    before = snapshot(outside)
    assert cli_main(["cache", "clear"]) == 0
    assert "removed 1 entries" in capsys.readouterr().out
    assert not any(path.name.startswith(key) for path in folder.iterdir())
    assert all(path.read_text() == "not the cache's" for path in planted)
    assert (folder / f"{key[:2]}{'0' * 62}.json").is_dir()
    assert (folder / f"{key[:2]}{'1' * 62}.o").is_symlink()
    assert snapshot(outside) == before
    assert cli_main(["cache", "info"]) == 0
    assert "entries:   0" in capsys.readouterr().out


def test_a_project_folder_as_cache_dir_keeps_its_files(tmp_path, monkeypatch, capsys):
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "ab").mkdir()
    for name in ("src/package.json", "src/main.o", "ab/cd.json", "README.md"):
        (project / name).write_text(name)
    before = snapshot(project)
    monkeypatch.setattr(config, "cache_dir", str(project))
    assert cli_main(["cache", "info"]) == 0
    assert "entries:   0" in capsys.readouterr().out
    assert cli_main(["cache", "clear"]) == 0
    assert "removed 0 entries" in capsys.readouterr().out
    after = snapshot(project)
    assert [path.name for path in set(after) - set(before)] == ["secret"]  # the cache's own
    del after[project / "secret"], after[project], before[project]  # the root: mtime
    assert after == before


def test_clear_leaves_an_entry_being_written(graph, kernel_cache_dir, capsys):
    choice = add_choice(graph)
    choice.load()
    key = key_of(choice)
    with default_cache().entry(key) as entry:  # held, as while compiling and storing
        assert entry.held
        assert cli_main(["cache", "clear"]) == 0
    out = capsys.readouterr().out
    assert "removed 0 entries" in out and "1 being written now were left" in out
    assert all(p.exists() for p in entry_paths(kernel_cache_dir, key))


def test_without_torch_the_cache_folder_is_the_one_inductor_names(tmp_path):
    """``cache info|clear`` answer without torch: they name Inductor's folder as Inductor
    does, with its variable and without."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    code = ("import sys; from cutedsl_inductor.compile.cache.disk_cache import default_root\n"
            "print(default_root(), 'torch' in sys.modules)")
    env = {k: v for k, v in os.environ.items()
           if k not in ("TORCHINDUCTOR_CACHE_DIR", "CUTEDSL_INDUCTOR_CACHE_DIR")}
    env.update(_CUTEDSL_INDUCTOR_DEFER_LOAD="1", PYTHONPATH=str(Path(__file__).resolve().parents[3]))
    for variable, expected in [(None, default_cache_dir()), ("rel", str(tmp_path / "rel"))]:
        if variable is not None:
            env["TORCHINDUCTOR_CACHE_DIR"] = variable
        run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=120)
        assert run.stdout.split() == [str(Path(expected) / "cutedsl"), "False"], run.stderr
