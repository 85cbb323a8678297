"""Where a cold process's GEMM autotuning time goes, by kind of choice (H200).

    python -m benchmarks.autotune_cost [--shapes 8192x14336x4096,8192x4096x4096]
                                       [--backends ATEN,TRITON ATEN,TRITON,CUTEDSL]

Each backend list runs in a fresh process with fresh Inductor and kernel caches, and
compiles ``x @ w`` (bf16, ``w`` a transposed weight as a Linear holds it) under
max-autotune-no-cudagraphs for each shape in turn, so the first shape pays the process's
cold start (compile workers, Triton's pool). Every choice's ``benchmark`` and every
``benchmark_gpu`` call are timed: a table per shape and backend list gives the first
call's seconds and, per kind of choice (ours, Triton's, ATen's), how many were timed
and the seconds their timing took, so that a timing cost that grows with CUTEDSL on can
be told apart from the cost of our own choices. Beside them: the seconds Inductor waited
on each op's precompilation, the Triton kernels compiled or loaded in this process
(``CachingAutotuner.precompile``: a choice whose kernel Inductor's compile pool did not
build, or one loaded at its first timed call) and our compile workers' counters (``counters.workers``).
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

MARK = "AUTOTUNE_COST "


def _parse_shapes(text: str) -> list[tuple[int, int, int]]:
    shapes = []
    for part in text.split(","):
        dims = part.split("x")
        if len(dims) != 3 or not all(d.isdigit() and int(d) > 0 for d in dims):
            raise argparse.ArgumentTypeError(f"--shapes {part!r}: expected MxKxN")
        shapes.append(tuple(int(d) for d in dims))
    return shapes


def _timed_choices(emit: Any) -> None:
    """Wrap each choice kind's ``benchmark`` to emit its seconds."""
    from torch._inductor.select_algorithm import ExternKernelCaller, TritonTemplateCaller

    from cutedsl_inductor.template.caller import CuteDSLTemplateCaller

    for kind, cls in (("ours", CuteDSLTemplateCaller), ("triton", TritonTemplateCaller),
                      ("aten", ExternKernelCaller)):
        def timed(method: Any, kind: str = kind) -> Any:
            @functools.wraps(method)
            def benchmark(self: Any, *args: Any, **kwargs: Any) -> float:
                import torch

                start = time.perf_counter()
                ms = method(self, *args, **kwargs)
                torch.cuda.synchronize()
                emit(kind=kind, ms=ms, s=time.perf_counter() - start)
                return ms
            return benchmark
        cls.benchmark = timed(cls.benchmark)


def _timed_phases(emit: Any) -> None:
    """Wrap the precompile wait and Triton's in-process kernel builds to emit seconds."""
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner
    from torch._inductor.select_algorithm import AlgorithmSelectorCache

    make_precompile_fn = AlgorithmSelectorCache.make_precompile_fn

    def timed_make(self: Any, *args: Any, **kwargs: Any) -> Any:
        wait = make_precompile_fn(self, *args, **kwargs)

        def timed_wait() -> Any:
            start = time.perf_counter()
            try:
                return wait()
            finally:
                emit(kind="precompile_wait", s=time.perf_counter() - start)
        return timed_wait

    AlgorithmSelectorCache.make_precompile_fn = timed_make
    precompile = CachingAutotuner.precompile

    def timed_precompile(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return precompile(self, *args, **kwargs)
        finally:
            emit(kind="triton_build", s=time.perf_counter() - start)

    CachingAutotuner.precompile = timed_precompile


def child(backends: str, shapes: list[tuple[int, int, int]]) -> None:
    import torch

    import cutedsl_inductor  # noqa: F401 - installs the backend
    from cutedsl_inductor import counters

    lock = threading.Lock()

    def emit(**fields: Any) -> None:
        # one write per line under a lock: precompile threads emit too
        with lock:
            sys.stdout.write(MARK + json.dumps(fields) + "\n")
            sys.stdout.flush()

    _timed_choices(emit)
    _timed_phases(emit)
    torch._inductor.config.max_autotune_gemm_backends = backends
    for m, k, n in shapes:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()
        torch._dynamo.reset()
        compiled = torch.compile(lambda a, b: a @ b, mode="max-autotune-no-cudagraphs")
        start = time.perf_counter()
        compiled(x, w)
        torch.cuda.synchronize()
        emit(shape=f"{m}x{k}x{n}", first_call_s=time.perf_counter() - start,
             workers=counters.snapshot()["workers"])


def run(backends: str, shapes: list[tuple[int, int, int]]) -> list[dict[str, Any]]:
    """One fresh process's rows: per shape, its first call and its choices by kind."""
    with tempfile.TemporaryDirectory(prefix="autotune-cost-") as root:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": f"{root}/inductor",
               "CUTEDSL_INDUCTOR_CACHE_DIR": f"{root}/kernels"}
        spec = ",".join(f"{m}x{k}x{n}" for m, k, n in shapes)
        done = subprocess.run([sys.executable, "-m", "benchmarks.autotune_cost", "--child",
                               backends, "--shapes", spec], env=env, capture_output=True,
                              text=True)
    if done.returncode != 0:
        raise SystemExit(f"{backends}: rc {done.returncode}\n{done.stderr[-3000:]}")
    rows, kinds = [], collections.defaultdict(lambda: [0, 0.0])
    before: dict[str, float] = {}
    for line in done.stdout.splitlines():
        if not line.startswith(MARK):
            continue
        fields = json.loads(line[len(MARK):])
        if "shape" in fields:
            row = {"shape": fields["shape"], "first_call_s": fields["first_call_s"]}
            for kind, (count, seconds) in kinds.items():
                row[f"{kind}_n"], row[f"{kind}_s"] = count, seconds
            # the workers' counters are the process's: a shape's are the difference
            for name, value in fields["workers"].items():
                row[f"workers_{name}"] = value - before.get(name, 0)
            before = fields["workers"]
            rows.append(row)
            kinds.clear()
        else:
            kinds[fields["kind"]][0] += 1
            kinds[fields["kind"]][1] += fields["s"]
    return rows


KINDS = ("ours", "triton", "aten", "precompile_wait", "triton_build")
WORKERS = ("started", "startup_s", "ready_wait_s", "queue_wait_s", "builds", "build_s")


def _table_row(row: dict[str, Any], backends: str) -> str:
    cells = [f"{row.get(f'{kind}_n', 0):>4} / {row.get(f'{kind}_s', 0.0):6.2f}"
             for kind in KINDS]
    cells += [f"{row.get(f'workers_{name}', 0):>8.4g}" for name in WORKERS]
    return (f"{row['shape']:>18} {backends:>20} {row['first_call_s']:>9.2f}s  "
            + "  ".join(f"{c:>13}" for c in cells))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", type=_parse_shapes,
                   default=_parse_shapes("8192x14336x4096,8192x4096x128256,8192x4096x4096"))
    p.add_argument("--backends", nargs="+", default=["ATEN,TRITON", "ATEN,TRITON,CUTEDSL"])
    p.add_argument("--child", metavar="BACKENDS", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child, args.shapes)
        return
    print(f"{'shape':>18} {'backends':>20} {'first call':>10}  "
          + "  ".join(f"{kind + ' n/s':>13}" for kind in KINDS) + "  "
          + "  ".join(f"{'w.' + name:>13}" for name in WORKERS))
    for backends in args.backends:
        for row in run(backends, args.shapes):
            print(_table_row(row, backends), flush=True)


if __name__ == "__main__":
    main()
