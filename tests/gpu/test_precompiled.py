"""A kernel cache filled without a GPU serves a GPU process: autotuning the add example
(three choices x three dtypes) in a new process loads every choice from it and compiles
nothing. The cache is precompiled here with the GPU hidden (``precompile --arch
sm_90a``) or, where ``CUTEDSL_INDUCTOR_TEST_PRECOMPILED`` names one, is a copy of a cache
precompiled on another machine (``benchmarks/gpu_all.sh`` passes the one it brought)."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]

EXAMPLE = textwrap.dedent("""
    import json
    import sys
    import torch
    from cutedsl_inductor import counters
    from cutedsl_inductor.kernels.elementwise import register_add_op
    register_add_op()
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        torch._dynamo.reset()
        x, y = (torch.randn(1024, 1024, device="cuda", dtype=dtype) for _ in range(2))
        with torch._inductor.config.patch(max_autotune=True, fx_graph_cache=False):
            out = torch.compile(torch.ops.cutedsl.add)(x, y)
        torch.testing.assert_close(out, x + y, rtol=0, atol=0)
    print(json.dumps({**counters.snapshot()["kernels"], "cutlass": "cutlass" in sys.modules}))
""")


def run(args, cache_dir, tmp_path, **env):
    env = {**os.environ, "CUTEDSL_INDUCTOR_CACHE_DIR": str(cache_dir),
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), **env}
    done = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def check_example_loads_everything(cache_dir, tmp_path):
    # no compile workers: a kernel the cache lacks compiles here and counts (a worker
    # would build it into the cache, and this process would count a disk hit)
    stats = json.loads(run(["-c", EXAMPLE], cache_dir, tmp_path,
                           CUTEDSL_INDUCTOR_COMPILE_WORKERS="0").splitlines()[-1])
    assert (stats["compiled"], stats["disk_hits"]) == (0, 9), stats
    assert not stats["cutlass"], stats  # loaded through TVM-FFI alone, and run correctly


def test_a_cache_precompiled_with_the_gpu_hidden_serves_every_choice(tmp_path):
    cache_dir = tmp_path / "kernels"
    out = run(["-m", "cutedsl_inductor", "precompile", "--arch", "sm_90a", "--templates",
               "elementwise"], cache_dir, tmp_path, CUDA_VISIBLE_DEVICES="",
              CUTE_DSL_ARCH="sm_90a", CUTEDSL_INDUCTOR_COMPILE_WORKERS="0")
    assert ("9 compiled, 0 from the local cache, 0 from the remote cache, 0 failed"
            in out), out
    check_example_loads_everything(cache_dir, tmp_path)


def test_a_cache_precompiled_on_another_machine_serves_every_choice(tmp_path):
    shipped = os.environ.get("CUTEDSL_INDUCTOR_TEST_PRECOMPILED")
    if not shipped:
        pytest.skip("CUTEDSL_INDUCTOR_TEST_PRECOMPILED names no precompiled cache")
    cache_dir = tmp_path / "kernels"
    shutil.copytree(shipped, cache_dir, symlinks=True)  # the example must not write there
    check_example_loads_everything(cache_dir, tmp_path)
