"""GPU half of the GPU-less precompile check: with CUTEDSL_INDUCTOR_CACHE_DIR pointing at
a cache filled by ``python -m cutedsl_inductor precompile --arch sm_90a`` on a machine
without a GPU, autotuning the add example must load every choice and compile nothing.

    python benchmarks/check_precompiled.py
"""

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cutedsl_inductor  # noqa: E402,F401
from cutedsl_inductor.compile import compiler  # noqa: E402
from cutedsl_inductor.templates.elementwise import register_add_op  # noqa: E402

register_add_op()
for dtype in (torch.float32, torch.bfloat16, torch.float16):
    torch._dynamo.reset()
    x, y = (torch.randn(1024, 1024, device="cuda", dtype=dtype) for _ in range(2))
    start = time.perf_counter()
    with torch._inductor.config.patch(max_autotune=True, fx_graph_cache=False):
        out = torch.compile(torch.ops.cutedsl.add)(x, y)
    torch.testing.assert_close(out, x + y, rtol=0, atol=0)
    print(f"{dtype}: correct, {time.perf_counter() - start:.2f} s to first result")
hits, compiled = compiler.stats["disk_hits"], compiler.stats["compiled"]
load_ms = compiler.stats["disk_load_s"] / max(hits, 1) * 1e3
print(f"precompiled cache: {hits} kernels loaded ({load_ms:.1f} ms each), {compiled} compiled")
sys.exit(0 if compiled == 0 and hits == 9 else 1)
