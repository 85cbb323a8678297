"""Time to precompile one GEMM's choices as Inductor does (its thread pool calling
``precompile`` on each), compiling in this process against compiling in worker
processes (``config.compile_workers``). GPU-less: runs anywhere, compiles for sm_90a.

    python -m benchmarks.compile_workers [--shapes MxNxK,...] [--workers 2,8]

Each run uses a fresh kernel cache and compiles the shapes one after another, as one
model's compile would; the worker runs include starting the pool.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

# GPU-less: CuTe DSL reads the arch when it is imported, so before anything imports it
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import torch  # noqa: E402
from torch._inductor import ir  # noqa: E402

from cutedsl_inductor import config  # noqa: E402
from cutedsl_inductor.autotune.scratch import scratch_graph  # noqa: E402
from cutedsl_inductor.bench.args import parse_shapes  # noqa: E402
from cutedsl_inductor.compile import compiler  # noqa: E402
from cutedsl_inductor.runtime import workers  # noqa: E402
from cutedsl_inductor.kernels.gemm.template import gemm_choices  # noqa: E402


def precompile_seconds(shapes: list[tuple[int, int, int]], workers_count: int
                       ) -> tuple[float, int]:
    """(wall seconds, choices) to precompile the heuristic's choices for each of
    ``shapes`` in turn (one pool for all of them, as in one model's compile)."""
    choices: list = []
    with tempfile.TemporaryDirectory() as cache, \
            config.patch(cache_dir=cache, compile_workers=workers_count, arch="sm_90a"), \
            scratch_graph() as scratch:
        compiler._COMPILED.clear()
        start = time.perf_counter()
        for m, n, k in shapes:
            a = scratch.input((m, k), torch.bfloat16)
            b = scratch.input((k, n), torch.bfloat16, (1, k))
            shape_choices: list = []
            gemm_choices(shape_choices, "mm", [a, b],
                         ir.FixedLayout(torch.device("cuda", 0), torch.bfloat16, [m, n]))
            with ThreadPoolExecutor(len(shape_choices)) as pool:
                list(pool.map(lambda choice: choice.precompile(), shape_choices))
            choices += shape_choices
        seconds = time.perf_counter() - start
        workers.pool().shutdown()
    failed = [c.name for c in choices if c.failure is not None]
    if failed:
        raise SystemExit(f"failed: {failed}")
    return seconds, len({c.name for c in choices})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compile_workers",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=parse_shapes,
                        default=[(4096, 4096, 4096), (128, 4096, 4096)])
    parser.add_argument("--workers", default="2")
    args = parser.parse_args(argv)
    base, count = precompile_seconds(args.shapes, 0)
    print(f"{count} kernels for {', '.join('x'.join(map(str, s)) for s in args.shapes)}; "
          f"{os.cpu_count()} CPUs")
    print(f"  in this process: {base:6.1f} s")
    for n in (int(w) for w in args.workers.split(",")):
        seconds, _ = precompile_seconds(args.shapes, n)
        print(f"  {n} workers:      {seconds:6.1f} s  ({base / seconds:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
