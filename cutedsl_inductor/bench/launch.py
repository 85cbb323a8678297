"""``python -m cutedsl_inductor bench launch``: launch overhead and compile/warm-start
times on a GPU.

    python -m cutedsl_inductor bench launch [--out DIR] [--steady-only]

Prints, measured in one run:
  * host µs per call, steady state, 2048x2048 float32 add: ``CuteDSLKernelWrapper.run``
    (of our template and of the upstream-style one through the fast path), a compiled
    graph running our CuteDSL kernel, the same graph through plain Inductor
    (Triton), through our loader of the upstream-style template (``from_dlpack`` records
    launched through TVM-FFI: ``compile/upstream.py``), eager torch, and (where
    importable) upstream's in-tree CuteDSL template;
  * cold time to first result of the three-choice autotuned example (fresh caches, new
    process), then the warm time (caches filled by that process, new process) with its
    number of CuTe compilations, whether it imported CuTe DSL (a warm one need not:
    ``runtime/loader.py``), and disk-cache load time per kernel.
Host µs = wall time of N back-to-back calls without synchronising, over N; "sync µs"
adds one synchronize at the end (so it includes GPU time when the GPU is the bottleneck).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from unittest.mock import patch

import torch
from torch._inductor.codegen.common import device_codegens
from torch._inductor.codegen.cuda_combined_scheduling import CUDACombinedScheduling
from torch._inductor.lowering import lowerings

from .. import config
from ..autotune.scratch import scratch_graph
from ..kernels.elementwise import ADD_SOURCE, UPSTREAM_ADD_SOURCE, add_template
from ..template.template import CuteDSLTemplate
from .args import output_folder

# the folder holding the package, for the measuring processes (which import it)
PACKAGE_PARENT = Path(__file__).resolve().parents[2]


def per_call_us(fn, calls: int = 400, rounds: int = 7) -> tuple[float, float]:
    """Medians over ``rounds`` of ``calls`` back-to-back calls. ``calls`` stays under
    the GPU's launch-queue depth (~1024), so the host never waits for the GPU and the
    host figure is pure host time."""
    for _ in range(20):
        fn()
    hosts, walls = [], []
    for _ in range(rounds):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        hosts.append(time.perf_counter() - start)
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - start)
    return (statistics.median(hosts) / calls * 1e6, statistics.median(walls) / calls * 1e6)


def lowering_patch(template, **params):
    def lower(a, b):
        choices = []
        err = template.maybe_append_choice(choices, input_nodes=[a, b],
                                           layout=a.get_layout(), **params)
        if err is not None:
            raise err
        return choices[0].output_node()

    return patch.dict(lowerings, {torch.ops.aten.add.Tensor: lower})


def steady_state_rows() -> list[tuple[str, float, float]]:
    symbolic_add = CuteDSLTemplate("bench_add_symbolic", ADD_SOURCE, symbolic_shapes=True)
    x, y = (torch.randn(2048, 2048, device="cuda") for _ in range(2))
    out = torch.empty_like(x)
    rows = []
    for label, template in (("static", add_template), ("symbolic", symbolic_add)):
        with scratch_graph() as scratch:
            a, b = (scratch.input((2048, 2048), torch.float32) for _ in range(2))
            wrapper = template.generate(input_nodes=[a, b], layout=a.get_layout(),
                                        THREADS=256, VECTOR=4).load()
        rows.append((f"CuteDSLKernelWrapper.run, {label} specs",
                     *per_call_us(lambda: wrapper.run(x, y, out))))
    with scratch_graph() as scratch, config.patch(upstream_fast_path=True):
        a, b = (scratch.input((2048, 2048), torch.float32) for _ in range(2))
        styled = CuteDSLTemplate("bench_upstream_style_add_direct", UPSTREAM_ADD_SOURCE).generate(
            input_nodes=[a, b], layout=a.get_layout(), THREADS_PER_BLOCK=256).load()
    stream = torch.cuda.current_stream().cuda_stream
    rows.append(("CuteDSLKernelWrapper.run, upstream-style (TVM-FFI fast path)",
                 *per_call_us(lambda: styled.run(x, y, out, stream=stream))))

    def add(p, q):
        return p + q

    torch._dynamo.reset()
    with torch._inductor.config.patch(fx_graph_cache=False), lowering_patch(
        add_template, THREADS=256, VECTOR=4
    ):
        ours = torch.compile(add)
        ours(x, y)
    rows.append(("compiled graph, CuteDSL kernel", *per_call_us(lambda: ours(x, y))))
    torch._dynamo.reset()
    triton_fn = torch.compile(add)
    triton_fn(x, y)
    rows.append(("compiled graph, Inductor Triton", *per_call_us(lambda: triton_fn(x, y))))
    for fast, label in ((False, "JitExecutor"), (True, "TVM-FFI fast path")):
        upstream_style = CuteDSLTemplate(f"bench_upstream_style_add_{int(fast)}",
                                         UPSTREAM_ADD_SOURCE)
        torch._dynamo.reset()
        with torch._inductor.config.patch(fx_graph_cache=False), lowering_patch(
            upstream_style, THREADS_PER_BLOCK=256
        ), config.patch(upstream_fast_path=fast):
            styled = torch.compile(add)
            styled(x, y)
        rows.append((f"upstream-style template in a compiled graph (ours, {label})",
                     *per_call_us(lambda: styled(x, y))))
    rows.append(("eager torch add", *per_call_us(lambda: add(x, y))))
    rows += upstream_rows(x, y)
    return rows


def upstream_rows(x, y) -> list[tuple[str, float, float]]:
    """Upstream's in-tree CuteDSL (torch 2.11+), for comparison only."""
    try:  # optional: torch's own CuteDSL templates
        from torch._inductor.codegen.cutedsl.cutedsl_template import (
            CuteDSLTemplate as Upstream,
        )
    except Exception as err:
        print(f"(upstream CuteDSL not importable: {err})")
        return []
    saved = dict(device_codegens)
    device_codegens["cuda"] = dataclasses.replace(device_codegens["cuda"],
                                                  scheduling=CUDACombinedScheduling)
    try:
        template = Upstream(name="bench_upstream_add", source=UPSTREAM_ADD_SOURCE)
        torch._dynamo.reset()
        with torch._inductor.config.patch(fx_graph_cache=False), lowering_patch(
            template, THREADS_PER_BLOCK=256
        ):
            fn = torch.compile(lambda p, q: p + q)
            fn(x, y)
        return [("compiled graph, upstream in-tree CuteDSL",
                 *per_call_us(lambda: fn(x, y), calls=20, rounds=3))]
    finally:
        device_codegens.update(saved)


STARTUP_SCRIPT = textwrap.dedent("""
    import json, sys, time
    start = time.perf_counter()
    import torch
    import cutedsl_inductor
    from cutedsl_inductor import counters
    from cutedsl_inductor.kernels.elementwise import register_add_op
    register_add_op()
    x, y = (torch.randn(2048, 2048, device="cuda") for _ in range(2))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch._inductor.config.patch(max_autotune=True):
        out = torch.compile(torch.ops.cutedsl.add)(x, y)
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    assert torch.equal(out, x + y)
    print(json.dumps({"first_result_s": t1 - t0, "process_s": t1 - start,
                      "cutlass": "cutlass" in sys.modules, **counters.snapshot()["kernels"]}))
""")

LOAD_SCRIPT = textwrap.dedent("""
    import json, sys, time
    import torch
    from cutedsl_inductor.autotune.scratch import scratch_graph
    from cutedsl_inductor import counters
    from cutedsl_inductor.kernels.elementwise import precompile_choices
    with scratch_graph() as scratch:
        choices = precompile_choices(scratch)
    times = []
    for choice in choices:
        t = time.perf_counter()
        choice.load()
        times.append(time.perf_counter() - t)
    print(json.dumps({"load_ms": [x * 1e3 for x in times], "cutlass": "cutlass" in sys.modules,
                      **counters.snapshot()["kernels"]}))
""")


def startup_rows() -> dict[str, dict]:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": f"{tmp}/inductor",
               "CUTEDSL_INDUCTOR_CACHE_DIR": f"{tmp}/kernels", "PYTHONPATH":
               f"{PACKAGE_PARENT}:{os.environ.get('PYTHONPATH', '')}"}
        results = {}
        for phase, script in (("cold", STARTUP_SCRIPT), ("warm", STARTUP_SCRIPT),
                              ("fill", LOAD_SCRIPT), ("load", LOAD_SCRIPT)):
            run = subprocess.run([sys.executable, "-c", script], env=env,
                                 capture_output=True, text=True)
            if run.returncode:
                print(run.stderr[-4000:])
                raise SystemExit(f"{phase} run failed")
            results[phase] = json.loads(run.stdout.strip().splitlines()[-1])
        return results


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=output_folder, help="folder for launch_overhead.json")
    parser.add_argument("--steady-only", action="store_true", help="skip the startup runs")


def main(args: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        print("bench launch needs a CUDA GPU")
        return 2
    rows = steady_state_rows()
    startup = {} if args.steady_only else startup_rows()
    print(f"\n{'2048x2048 float32 add, steady state':52s} {'host us/call':>12s} "
          f"{'sync us/call':>12s}")
    for name, host, wall in rows:
        print(f"{name:52s} {host:12.1f} {wall:12.1f}")
    triton = next(r for r in rows if "Triton" in r[0])
    ours = next(r for r in rows if "CuteDSL kernel" in r[0])
    styled = next(r for r in rows if "compiled graph (ours, TVM-FFI fast path)" in r[0])
    print(f"{'ratio in-graph CuteDSL / Triton (host)':52s} {ours[1] / triton[1]:12.2f}")
    print(f"{'ratio in-graph upstream-style fast path / Triton (host)':52s} "
          f"{styled[1] / triton[1]:12.2f}")
    if args.out:
        (args.out / "launch_overhead.json").write_text(
            json.dumps({"rows": rows, "startup": startup}, indent=1))
    if not startup:
        return 0
    print("\nthree-choice autotuned example (max-autotune), new process each:")
    for phase in ("cold", "warm"):
        r = startup[phase]
        print(f"  {phase}: first result {r['first_result_s']:.2f} s (process "
              f"{r['process_s']:.2f} s; CuTe DSL imported: {r['cutlass']}), "
              f"CuTe compilations {r['compiled']}, kernels loaded from disk {r['disk_hits']}")
    load = startup["load"]
    rest = sorted(load["load_ms"][1:])
    print(f"loading {len(load['load_ms'])} cached kernels in a new process: compilations "
          f"{load['compiled']}, first {load['load_ms'][0]:.1f} ms (one-time runtime libraries),"
          f" then median {rest[len(rest) // 2]:.2f} ms, max {rest[-1]:.2f} ms per kernel "
          f"(the fill run imported CuTe DSL: {startup['fill']['cutlass']}; this one: "
          f"{load['cutlass']})")
    return 0
