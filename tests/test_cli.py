"""The command line, run as a user would (GPU-less: precompile compiles for sm_90a)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cli(*args, cache_dir):
    env = {"CUTEDSL_INDUCTOR_CACHE_DIR": str(cache_dir), "PATH": "/usr/bin:/bin",
           "CUTE_DSL_ARCH": "sm_90a", "HOME": str(cache_dir)}
    return subprocess.run([sys.executable, "-m", "cutedsl_inductor", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)


def test_precompile_then_cache_info_then_clear(tmp_path):
    cache_dir = tmp_path / "kernels"
    run = cli("precompile", "--arch", "sm_90a", "--templates", "elementwise", cache_dir=cache_dir)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "precompiled 9 kernel(s), 0 already cached, 0 failed" in run.stdout
    assert "precompile sm_90a" in run.stderr  # the progress bar
    again = cli("precompile", "--templates", "elementwise", cache_dir=cache_dir)
    assert "precompiled 0 kernel(s), 9 already cached" in again.stdout
    info = cli("cache", "info", cache_dir=cache_dir)
    assert f"cache dir: {cache_dir}" in info.stdout and "entries:   9" in info.stdout
    assert "elementwise_add" in info.stdout
    cleared = cli("cache", "clear", cache_dir=cache_dir)
    assert "removed 9 entries" in cleared.stdout
    assert "entries:   0" in cli("cache", "info", cache_dir=cache_dir).stdout
