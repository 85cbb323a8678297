"""``make demo`` / ``python -m cutedsl_inductor demo``: the main job, end to end.

With an NVIDIA GPU: torch.compile (max-autotune) of ``cutedsl::add`` plus a ReLU, whose
lowering offers three CuteDSL template choices and ATen's add; Inductor prints its
autotune table, the result is checked against eager, and the generated kernel files
and cache entries are listed. Without a GPU: the same template choices are compiled
for sm_90a without a GPU, the generated files and cached binaries are listed, and the
demo says plainly that nothing ran on a GPU, or, where a choice failed to compile, that
the demo failed (exit status 1).
"""

from __future__ import annotations

import sys
import time

import torch

from . import counters
from .compile.cache.disk_cache import default_cache
from .kernels.elementwise import register_add_op
from .precompile import precompile


def _show_cache() -> None:
    cache = default_cache()
    entries = cache.entries()
    print(f"\nkernel cache {cache.root}: {len(entries)} entr{'y' if len(entries) == 1 else 'ies'}")
    for entry in entries[-6:]:
        print(f"  {entry.get('kernel')} [{entry.get('arch')}] {entry.get('params')}\n"
              f"    arguments: {entry.get('signature')}\n    source: {entry.get('path')}")


def demo_gpu() -> None:
    register_add_op()

    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.ops.cutedsl.add(a, b))

    a, b = (torch.randn(2048, 2048, device="cuda") for _ in range(2))
    print("torch.compile(relu(cutedsl::add(a, b))), 2048x2048 float32, max-autotune:")
    start = time.perf_counter()
    with torch._inductor.config.patch(max_autotune=True, fx_graph_cache=False):
        out = torch.compile(fn)(a, b)
    torch.cuda.synchronize()
    print(f"first call (compile + autotune) took {time.perf_counter() - start:.2f} s; "
          f"{counters.kernels.compiled} CuTe compilation(s)")
    torch.testing.assert_close(out, fn(a, b), rtol=0, atol=0)
    print("result matches eager: OK")
    _show_cache()


def demo_cpu() -> int:
    """Its exit status: 1 where a choice failed to compile."""
    print("No CUDA GPU here: compiling the same CuteDSL template choices for sm_90a "
          "without a GPU (real CuTe DSL compiler, real cubins).")
    summary = precompile("sm_90a", templates=("elementwise",))
    print(summary)
    _show_cache()
    if summary.failed:
        print(f"\nThe demo FAILED: {len(summary.failed)} of its kernels did not compile "
              "(the reasons are above).", file=sys.stderr)
        return 1
    print("\nNothing ran on a GPU. On an sm_90 machine with the same cache directory "
          "(CUTEDSL_INDUCTOR_CACHE_DIR) these kernels load without compiling.")
    return 0


def main() -> int:
    """The exit status: the GPU demo raises where it fails."""
    if torch.cuda.is_available():
        demo_gpu()
        return 0
    return demo_cpu()
