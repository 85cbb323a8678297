"""What a warm process spends in our code, GPU-less: from the output code's first
``load_kernel`` to its kernels ready to launch, per phase.

    python -m benchmarks.warm_load [--runs 3] [--tokens 2048]

A cold process lowers a Llama-3-8B-shaped block (the q and o projections with the
residual, SwiGLU, the down projection with the residual) on a virtual sm_90 under
max-autotune with our GEMM alone (one config per GEMM) and compiles its kernels into a
fresh disk cache. Then each run is a fresh interpreter that imports torch and
cutedsl_inductor and runs the output code's kernel definitions as the output module does
(an FX graph cache hit runs nothing else of ours): the seconds of each
``load_kernel``, whether CuTe DSL or the GEMM's modules were imported; one more run under
cProfile gives the cumulative seconds of the phases in ``PHASES`` (a phase the code at
hand does not have is left out). A last interpreter times ``import cutlass.cute`` after
torch, for comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# phase -> (file suffix, function name) in cProfile's stats
PHASES = {
    "import cutlass": ("cutlass/__init__.py", "<module>"),
    "run rendered sources": ("runtime/loader.py", "import_source"),
    "kernel key": ("runtime/loader.py", "kernel_key"),
    "source file": ("runtime/loader.py", "source_file"),
    "disk entry (lock, read, verify, load)": ("compile/cache/disk_cache.py", "load"),
    "verify (seal, sizes, sha256)": ("compile/cache/disk_cache.py", "_check"),
    "load library (TVM-FFI)": ("compile/cache/objects.py", "load_library"),
    "load object (CuTe DSL)": ("compile/cache/objects.py", "load_object"),
    "cute.runtime.load_module": ("cutlass/runtime.py", "load_module"),
}

COLD = r"""
import sys
import torch
import torch.nn.functional as F
from cutedsl_inductor import config
from cutedsl_inductor.bench.lowering import kernel_definitions, load_kernels, lowered
from cutedsl_inductor.bench.lowering import virtual_sm90

def block(x, wq, wo, w1, w3, w2):
    h = x + (x @ wq.t()) @ wo.t()
    return h + (F.silu(h @ w1.t()) * (h @ w3.t())) @ w2.t()

tokens = int(sys.argv[2])
shapes = [(tokens, 4096), (4096, 4096), (4096, 4096), (14336, 4096), (14336, 4096),
          (4096, 14336)]
with virtual_sm90(), torch._inductor.config.patch(
        max_autotune=True, max_autotune_gemm_backends="CUTEDSL",
        **{"test_configs.autotune_choice_desc_regex": "sm90_gemm"}), \
        config.patch(epilogue_fusion=True, gemm_max_configs=1), \
        lowered(block, *shapes, post_grad=True) as graph:
    code = graph.codegen()[0].value
load_kernels(kernel_definitions(code))
open(sys.argv[1], "w").write(code)
"""

WARM = r"""
import ast, cProfile, json, pstats, sys, time
start = time.perf_counter()
import torch
torch_s = time.perf_counter() - start
import cutedsl_inductor
package_s = time.perf_counter() - start - torch_s
from cutedsl_inductor.bench.lowering import kernel_definitions
from cutedsl_inductor import counters
text = open(sys.argv[1]).read()
ours = [n for n in ast.parse(text).body if isinstance(n, ast.ImportFrom)
        and (n.module or "").startswith("cutedsl_inductor")] + kernel_definitions(text)
namespace, loads, phases = {}, [], {}
profile = cProfile.Profile() if sys.argv[3] == "1" else None
for node in ours:
    code = compile(ast.Module([node], type_ignores=[]), "output_code", "exec")
    begin = time.perf_counter()
    if profile is None:
        exec(code, namespace)
    else:
        profile.runctx("exec(code, namespace)", {"code": code, "namespace": namespace}, {})
    if isinstance(node, ast.Assign):
        loads.append(time.perf_counter() - begin)
for (path, _, name), row in (pstats.Stats(profile).stats.items() if profile else ()):
    for phase, (suffix, function) in json.loads(sys.argv[2]).items():
        if path.endswith(suffix) and name == function:
            phases[phase] = phases.get(phase, 0.0) + row[3]
print(json.dumps({"torch_s": torch_s, "package_s": package_s, "loads": loads, "phases": phases,
                  "cutlass": "cutlass" in sys.modules,
                  "gemm_modules": sum(m.startswith("cutedsl_inductor.kernels.gemm")
                                      for m in sys.modules),
                  "stats": counters.snapshot()["kernels"]}))
"""

CUTLASS = r"""
import time, torch
start = time.perf_counter()
import cutlass.cute
print(time.perf_counter() - start)
"""


def child(script: str, *args: str, env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-c", script, *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    return done.stdout.splitlines()[-1] if done.stdout else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.warm_load",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=2048)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", PYTHONPATH=str(REPO),
                   CUTEDSL_INDUCTOR_CACHE_DIR=os.path.join(folder, "kernels"),
                   TORCHINDUCTOR_CACHE_DIR=os.path.join(folder, "inductor"))
        output_code = os.path.join(folder, "output_code.py")
        child(COLD, output_code, str(args.tokens), env=env)
        print(f"{REPO} ({os.cpu_count()} CPUs): warm runs of {output_code}")
        for run in range(args.runs + 1):
            profiled = run == args.runs  # the last run, for the phases
            row = json.loads(child(WARM, output_code, json.dumps(PHASES), str(int(profiled)),
                                   env=env))
            loads = " + ".join(f"{s:.3f}" for s in row["loads"])
            print(f"{'profiled' if profiled else f'run {run + 1}'}: import torch "
                  f"{row['torch_s']:.2f} s, cutedsl_inductor {row['package_s']:.2f} s; "
                  f"load_kernel x{len(row['loads'])}: {loads} = {sum(row['loads']):.3f} s; "
                  f"cutlass imported: {row['cutlass']}, GEMM modules: {row['gemm_modules']}; "
                  f"disk hits {row['stats']['disk_hits']}, compiled {row['stats']['compiled']}")
            for phase, seconds in row["phases"].items():
                print(f"    {phase:40s} {seconds:.4f} s")
        print(f"import cutlass.cute after torch: {float(child(CUTLASS, env=env)):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
