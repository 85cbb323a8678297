"""A warm process: Inductor's output code of a GEMM graph (lowered on a virtual sm_90, its
kernels compiled GPU-less into the disk cache and published to a real Redis), its kernel
definitions run in a fresh interpreter as the output module runs them, with the cold
process's disk cache (locally warm) or an empty one and the Redis (remotely warm). Every
kernel comes from that tier as a TVM-FFI function, and neither CuTe DSL nor the GEMM's
modules are imported."""

import pytest

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from tests.helpers import kernel_definitions, load_kernels, lowered, virtual_sm90_max_autotune

ROOT = Path(__file__).resolve().parents[2]

WARM = r'''
import ast, json, sys
import torch
import cutedsl_inductor
from cutedsl_inductor import counters
from cutedsl_inductor.exc import KernelArgumentError

module = ast.parse(open(sys.argv[1]).read())
namespace = {}
exec(compile(module, "output_code", "exec"), namespace)
kernels = {name: namespace[name] for name in json.loads(sys.argv[2])}
refused = []
for wrapper in kernels.values():
    a = torch.zeros(64, 64, dtype=torch.bfloat16)  # on the CPU: the kernel refuses it
    try:
        wrapper.run(a, a, a)
    except KernelArgumentError as err:
        refused.append(str(err))
print(json.dumps({
    "cutlass": sorted(m for m in sys.modules if m == "cutlass" or m.startswith("cutlass.")),
    "kernels_modules": sorted(m for m in sys.modules if m.startswith("cutedsl_inductor.kernels")),
    "functions": [type(w.kernel_fn).__module__ + "." + type(w.kernel_fn).__name__
                  for w in kernels.values()],
    "origins": [w.origin for w in kernels.values()],
    "refused": refused,
    "stats": counters.snapshot()["kernels"],
}))
'''


def our_part_of(code):
    """The output module's statements that are ours: its imports of cutedsl_inductor
    and its ``load_kernel`` definitions, in their order."""
    definitions = kernel_definitions(code)
    imports = [node for node in ast.parse(code).body if isinstance(node, ast.ImportFrom)
               and (node.module or "").startswith("cutedsl_inductor")]
    return ast.unparse(ast.Module([*imports, *definitions], type_ignores=[])), definitions


@pytest.mark.parametrize("tier", ["disk", "remote"])
def test_a_warm_process_loads_its_kernels_without_cute_dsl(monkeypatch, tmp_path,
                                                           kernel_cache_dir, remote_redis, tier):
    def graph(x, w1, w2):
        return torch.relu(x @ w1.t()) @ w2.t()

    with virtual_sm90_max_autotune(monkeypatch, "CUTEDSL", gemm_max_configs=1), \
            lowered(graph, (256, 256), (256, 256), (256, 256)) as lowering:
        code = lowering.codegen()[0].value
    source, definitions = our_part_of(code)
    assert len(definitions) == 2  # relu fused into the first GEMM's epilogue
    load_kernels(definitions)  # the cold process: compiled into the disk cache
    (tmp_path / "ours.py").write_text(source)

    names = [d.targets[0].id for d in definitions]
    cache_dir = kernel_cache_dir if tier == "disk" else tmp_path / "another_machine"
    python_path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, **remote_redis.env(), "CUTEDSL_INDUCTOR_CACHE_DIR": str(cache_dir),
           "PYTHONPATH": python_path}
    run = subprocess.run([sys.executable, "-c", WARM, str(tmp_path / "ours.py"),
                          json.dumps(names)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    warm = json.loads(run.stdout.splitlines()[-1])
    assert warm["cutlass"] == [] and warm["kernels_modules"] == []
    assert warm["functions"] == ["tvm_ffi.core.Function"] * 2
    assert warm["origins"] == [tier] * 2
    assert warm["stats"][f"{tier}_hits"] == 2 and warm["stats"]["compiled"] == 0
    # each one is the kernel's launcher, whose own checks refuse CPU tensors
    assert len(warm["refused"]) == 2
    assert all("expected a CUDA tensor" in message for message in warm["refused"])
