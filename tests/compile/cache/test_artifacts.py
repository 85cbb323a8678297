"""torch.compile's portable cache artifacts carry our kernels and tuning decisions: a
fresh machine that loads them compiles nothing; a tampered artifact is skipped; a process
that has not imported cutedsl_inductor is told so by torch's warning."""

import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from torch.compiler._cache import CacheArtifactManager

from cutedsl_inductor import config, counters
from cutedsl_inductor.compile import compiler
from cutedsl_inductor.compile.cache import decisions, portable
from cutedsl_inductor.compile.cache.portable import ARTIFACT_TYPE
from tests.compile.cache.test_disk_cache import add_choice, key_of
from tests.compile.cache.test_remote_cache import load_on

ROOT = Path(__file__).resolve().parents[3]


def saved(graph, monkeypatch, cache_dir):
    """The artifacts of a process that compiled the add kernel and made a decision."""
    with CacheArtifactManager.with_fresh_cache():
        load_on(graph, monkeypatch, cache_dir)
        decisions.save("d" * 64, {"winner": "fastest"})
        return torch.compiler.save_cache_artifacts()


def test_a_fresh_machine_that_loads_the_artifacts_compiles_nothing(graph, tmp_path,
                                                                    monkeypatch):
    blob, info = saved(graph, monkeypatch, tmp_path / "a")
    assert info.artifacts[ARTIFACT_TYPE] == [key_of(add_choice(graph)), "d" * 64]
    monkeypatch.setattr(config, "cache_dir", str(tmp_path / "b"))
    with CacheArtifactManager.with_fresh_cache():
        loaded = torch.compiler.load_cache_artifacts(blob)
    assert loaded.artifacts[ARTIFACT_TYPE] == info.artifacts[ARTIFACT_TYPE]
    assert load_on(graph, monkeypatch, tmp_path / "b").origin == "disk"
    assert counters.kernels.compiled == 1  # the first machine's compile only
    assert decisions.lookup("d" * 64) == {"winner": "fastest"}


def test_a_kernel_loaded_from_the_cache_is_carried_too(graph, tmp_path, monkeypatch):
    load_on(graph, monkeypatch, tmp_path / "a")
    with CacheArtifactManager.with_fresh_cache():
        assert load_on(graph, monkeypatch, tmp_path / "a").origin == "disk"
        _, info = torch.compiler.save_cache_artifacts()
    assert info.artifacts[ARTIFACT_TYPE] == [key_of(add_choice(graph))]


def test_a_tampered_artifact_is_skipped_and_the_kernel_compiles(graph, tmp_path, monkeypatch,
                                                                caplog):
    """(torch's serializer checksums the whole blob, but not cryptographically: what a
    loader can trust is what our entries prove.)"""
    load_on(graph, monkeypatch, tmp_path / "a")
    key = key_of(add_choice(graph))
    entry = portable.pack("kernel", key, (tmp_path / "a" / key[:2] / f"{key}.o").read_bytes(),
                          {}, None)
    at = len(entry) - 1000  # inside the object
    with CacheArtifactManager.with_fresh_cache():
        CacheArtifactManager.record_artifact(
            ARTIFACT_TYPE, key, entry[:at] + bytes([entry[at] ^ 0xFF]) + entry[at + 1:])
        decisions.save("d" * 64, {"winner": "fastest"})
        blob, _ = torch.compiler.save_cache_artifacts()
    monkeypatch.setattr(config, "cache_dir", str(tmp_path / "b"))
    with CacheArtifactManager.with_fresh_cache(), caplog.at_level(logging.WARNING):
        torch.compiler.load_cache_artifacts(blob)
    assert "refused: checksum mismatch; skipped" in caplog.text
    assert load_on(graph, monkeypatch, tmp_path / "b").origin == "compiled"
    assert decisions.lookup("d" * 64) == {"winner": "fastest"}  # the rest still loads


FRESH_MACHINE = textwrap.dedent("""
    import sys, torch
    {imports}
    print("loaded:", torch.compiler.load_cache_artifacts(open(sys.argv[1], "rb").read()))
    from cutedsl_inductor.precompile import precompile
    print(precompile("sm_90a", ("elementwise",), progress=False))
""")


def test_precompiled_kernels_travel_to_a_fresh_process(tmp_path):
    """Process one precompiles and saves the artifacts; a process with another cache dir
    loads them first and compiles 0 kernels. One that did not import cutedsl_inductor
    before loading is told so by torch's warning, which names what to do."""
    save = textwrap.dedent("""
        import sys, torch
        from cutedsl_inductor.precompile import precompile
        print(precompile("sm_90a", ("elementwise",), progress=False))
        open(sys.argv[1], "wb").write(torch.compiler.save_cache_artifacts()[0])
    """)
    blob = tmp_path / "artifacts.bin"
    first = run(save, blob, tmp_path / "a")
    assert "9 compiled, 0 from the local cache" in first.stdout, first.stderr[-3000:]
    fresh = run(FRESH_MACHINE.format(imports="import cutedsl_inductor"), blob, tmp_path / "b")
    assert "0 compiled, 9 from the local cache, 0 from the remote cache, 0 failed" \
        in fresh.stdout, fresh.stderr[-3000:]
    late = run(FRESH_MACHINE.format(imports=""), blob, tmp_path / "c")
    assert "loaded: None" in late.stdout and "9 compiled" in late.stdout
    assert (f"AssertionError: Artifact of type={ARTIFACT_TYPE} not registered"
            in late.stderr), late.stderr[-3000:]
    assert ARTIFACT_TYPE.endswith("(import cutedsl_inductor before load_cache_artifacts)")


def run(script, blob, cache_dir):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(cache_dir), "CUTE_DSL_ARCH": "sm_90a",
           "CUTEDSL_INDUCTOR_CACHE_DIR": str(cache_dir), "CUTEDSL_INDUCTOR_COMPILE_WORKERS": "0",
           "TORCHINDUCTOR_CACHE_DIR": str(cache_dir / "inductor")}
    return subprocess.run([sys.executable, "-c", script, str(blob)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
