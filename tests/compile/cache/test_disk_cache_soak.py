"""A bounded soak of the kernel cache: 4 processes precompiling and 2 clearing one cache
for 60 s (real GPU-less compiles); afterwards every entry verifies, every kernel loads,
and nothing outside the cache dir changed, though the cache holds traps that lead out."""

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from cutedsl_inductor.compile.cache.disk_cache import KernelDiskCache
from cutedsl_inductor.precompile import precompile
from tests.compile.cache.test_disk_cache import snapshot

ROOT = Path(__file__).resolve().parents[3]
SECONDS = 60

PRECOMPILER = textwrap.dedent("""
    import sys, time
    from cutedsl_inductor.precompile import precompile
    from cutedsl_inductor.compile import compiler
    rounds = 0
    while time.time() < float(sys.argv[1]):
        compiler._COMPILED.clear()  # each round as a new process
        summary = precompile("sm_90a", ("elementwise",), progress=False)
        assert not summary.failed and summary.compiled + summary.local == 9, str(summary)
        rounds += 1
    print(rounds)
""")

CLEARER = textwrap.dedent("""
    import sys, time
    from cutedsl_inductor.compile.cache.disk_cache import default_cache
    removed = 0
    while time.time() < float(sys.argv[1]):
        result = default_cache().clear()
        assert not result.errors, result.errors
        removed += result.removed
        time.sleep(0.5)
    print(removed)
""")


def plant_traps(cache_dir, outside):
    """Things in the cache that lead out of it: a subfolder linked elsewhere, key-named
    symlinks to files elsewhere, files of someone else."""
    (outside / "deep").mkdir(parents=True)
    for name in ("settings.json", "lib.o", "deep/x.json", "e" * 64 + ".json"):
        (outside / name).write_text(name)
    cache_dir.mkdir(parents=True)
    (cache_dir / "ee").symlink_to(outside)
    (cache_dir / "ff").mkdir(0o700)
    (cache_dir / "ff" / ("f" * 64 + ".json")).symlink_to(outside / "settings.json")
    (cache_dir / "ff" / "notes.json").write_text("someone else's")


def test_precompiling_and_clearing_at_once(tmp_path, kernel_cache_dir):
    cache_dir, outside = kernel_cache_dir, tmp_path / "outside"
    plant_traps(cache_dir, outside)
    before = snapshot(outside)
    env = {**os.environ, "CUTEDSL_INDUCTOR_CACHE_DIR": str(cache_dir),
           "CUTEDSL_INDUCTOR_COMPILE_WORKERS": "0",
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    deadline = str(time.time() + SECONDS)
    procs = [subprocess.Popen([sys.executable, "-c", script, deadline], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for script in [PRECOMPILER] * 4 + [CLEARER] * 2]
    outputs = [p.communicate(timeout=SECONDS + 300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outputs]
    rounds = [int(out.split()[-1]) for out, _ in outputs[:4]]
    assert min(rounds) >= 1

    assert snapshot(outside) == before
    assert (cache_dir / "ff" / "notes.json").read_text() == "someone else's"
    cache = KernelDiskCache(cache_dir)
    entries = cache.entries()
    assert all(entry["verified"] for entry in entries)
    for entry in entries:
        with cache.entry(entry["key"]) as handle:
            assert handle.load() is not None
    summary = precompile("sm_90a", ("elementwise",), progress=False)  # into this cache too
    assert not summary.failed and summary.compiled + summary.local == 9
