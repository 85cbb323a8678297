"""torch.compile end to end on an sm_90 GPU (marker ``gpu``; skipped elsewhere)."""

import csv
import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from unittest.mock import patch

import pytest
import torch

from tests.helpers import TORCH

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def compile_and_run(fn, *args):
    from torch._inductor.utils import run_and_get_code

    with torch._inductor.config.patch(fx_graph_cache=False, max_autotune=False):
        result, codes = run_and_get_code(torch.compile(fn), *args)
    return result, "\n".join(codes)


def one_choice_lowering(template, **params):
    from torch._inductor.lowering import lowerings

    def lower(a, b):
        choices = []
        template.maybe_append_choice(choices, input_nodes=[a, b], layout=a.get_layout(),
                                     **params)
        return choices[0].output_node()

    return patch.dict(lowerings, {torch.ops.aten.add.Tensor: lower})


def test_one_choice_end_to_end():
    from cutedsl_inductor import counters
    from cutedsl_inductor.kernels.elementwise import add_template

    x, y = (torch.randn(257, 129, device="cuda") for _ in range(2))
    with one_choice_lowering(add_template, THREADS=128, VECTOR=4):
        result, code = compile_and_run(lambda a, b: a + b, x, y)
    torch.testing.assert_close(result, x + y, rtol=0, atol=0)
    assert "load_kernel(\n    'cutedsl_elementwise_add_" in code and "@cute.kernel" in code
    assert "# kernel path: " in code
    assert counters.kernels.compiled == 1


def test_upstream_template_runs_unchanged_and_compiles_once():
    from cutedsl_inductor import CuteDSLTemplate
    from cutedsl_inductor import counters
    from cutedsl_inductor.kernels.elementwise import UPSTREAM_ADD_SOURCE

    template = CuteDSLTemplate("upstream_add_e2e", UPSTREAM_ADD_SOURCE)
    x, y = (torch.randn(128, 4, device="cuda") for _ in range(2))
    with one_choice_lowering(template, THREADS_PER_BLOCK=256):
        compiled = torch.compile(lambda a, b: a + b)
        for _ in range(3):
            result = compiled(x, y)
    torch.testing.assert_close(result, x + y, rtol=0, atol=0)
    assert counters.kernels.compiled == 1


def test_autotune_among_three_choices():
    from cutedsl_inductor.kernels.elementwise import register_add_op

    register_add_op()
    x, y = (torch.randn(1024, 1000, device="cuda") for _ in range(2))
    result, code = compile_and_run(torch.ops.cutedsl.add, x, y)
    torch.testing.assert_close(result, x + y, rtol=0, atol=0)
    assert "cutedsl_elementwise_add_" in code or "cutedsl_aten_add" in code


def test_env_stream_is_used():
    from cutedsl_inductor.kernels.elementwise import add_template

    x, y = (torch.randn(4096, 512, device="cuda") for _ in range(2))
    with one_choice_lowering(add_template, THREADS=256, VECTOR=4):
        compiled = torch.compile(lambda a, b: a + b)
        compiled(x, y)
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            torch.cuda._sleep(10_000_000)
            result = compiled(x, y)
        side.synchronize()
    torch.testing.assert_close(result, x + y, rtol=0, atol=0)


def test_a_kernel_loaded_from_its_shared_library_runs_on_the_current_stream(graph):
    """Loaded through TVM-FFI from the disk cache's library (no CuTe DSL on that path):
    it launches on the caller's stream and computes what the compiled one does."""
    from cutedsl_inductor.compile import compiler
    from cutedsl_inductor import counters
    from tests.compile.cache.test_disk_cache import add_choice

    add_choice(graph, shape=(4096, 512)).load()  # compiled, stored with its library
    compiler._COMPILED.clear()
    wrapper = add_choice(graph, shape=(4096, 512)).load()
    assert wrapper.origin == "disk" and counters.kernels.disk_hits == 1
    x, y = (torch.randn(4096, 512, device="cuda") for _ in range(2))
    out = torch.empty_like(x)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(10_000_000)
        wrapper.run(x, y, out)
    side.synchronize()
    torch.testing.assert_close(out, x + y, rtol=0, atol=0)


def test_wrong_argument_is_a_clear_error():
    import torch.fx
    from torch._inductor.graph import GraphLowering
    from torch._inductor.virtualized import V

    from cutedsl_inductor.exc import KernelArgumentError
    from cutedsl_inductor.kernels.elementwise import add_template
    from tests.helpers import make_input, make_layout

    graph = GraphLowering(torch.fx.symbolic_trace(lambda x: x))
    with V.set_graph_handler(graph):
        inputs = [make_input(graph, "arg0_1", (64, 128)), make_input(graph, "arg1_1", (64, 128))]
        wrapper = add_template.generate(input_nodes=inputs, layout=make_layout((64, 128)),
                                        THREADS=128, VECTOR=4).load()
    a, b, out = (torch.randn(64, 128, device="cuda") for _ in range(3))
    wrapper.run(a, b, out)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, a + b, rtol=0, atol=0)
    with pytest.raises(KernelArgumentError, match="elementwise_add") as info:
        wrapper.run(a.half(), b, out)
    assert "float16" in str(info.value)


WARM_SCRIPT = textwrap.dedent("""
    import torch
    from cutedsl_inductor import counters
    from cutedsl_inductor.kernels.elementwise import register_add_op
    register_add_op()
    torch.manual_seed(0)
    x, y = (torch.randn(1024, 1000, device="cuda") for _ in range(2))
    with torch._inductor.config.patch(max_autotune=False):
        out = torch.compile(torch.ops.cutedsl.add)(x, y)
    assert torch.equal(out, x + y)
    print("compiled", counters.kernels.compiled)
""")


def test_warm_process_compiles_nothing(tmp_path):
    """The first process builds the kernel (in this process or a compile worker: either
    way a new object file in the cache); the second builds and rewrites nothing."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
           "CUTEDSL_INDUCTOR_CACHE_DIR": str(tmp_path / "kernels")}

    def run_and_list_objects():
        run = subprocess.run([sys.executable, "-c", WARM_SCRIPT], cwd=ROOT, env=env,
                             capture_output=True, text=True)
        assert run.returncode == 0, run.stderr[-3000:]
        objects = sorted((tmp_path / "kernels").rglob("*.o"))
        return run.stdout.split()[-1], [(path, path.stat().st_mtime_ns) for path in objects]

    _, cold_objects = run_and_list_objects()
    assert cold_objects
    warm_compiled, warm_objects = run_and_list_objects()
    assert warm_compiled == "0" and warm_objects == cold_objects


FLEET_SCRIPT = WARM_SCRIPT + textwrap.dedent("""
    import sys
    if sys.argv[1:] == ["save"]:
        open("artifacts.bin", "wb").write(torch.compiler.save_cache_artifacts()[0])
""")


@pytest.mark.parametrize("share", ["redis", "artifacts"])
def test_another_machine_compiles_nothing(tmp_path, share, request):
    """Separate Inductor and kernel caches: the second machine gets the graph and the
    kernel through Inductor's remote FX graph cache and our remote tier on one Redis, or
    through the first one's cache artifacts (loaded after importing cutedsl_inductor).
    Compiles stay in the process (no compile workers), where ``counters.kernels`` counts them."""
    env = {**os.environ, "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE": str(int(share == "redis")),
           "CUTEDSL_INDUCTOR_COMPILE_WORKERS": "0"}
    if share == "redis":
        env.update(request.getfixturevalue("redis_server").env())
    # the project first, then whatever put CuTe DSL on the path (without it the lowering
    # falls back to ATen and nothing compiles)
    python_path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))

    def run(machine, *args, prelude=""):
        machine_env = {**env, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / machine / "inductor"),
                       "CUTEDSL_INDUCTOR_CACHE_DIR": str(tmp_path / machine / "kernels")}
        done = subprocess.run([sys.executable, "-c", prelude + FLEET_SCRIPT, *args], cwd=tmp_path,
                              env={**machine_env, "PYTHONPATH": python_path},
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout.split()[-1]

    assert run("a", "save") != "0"
    load = ("import torch, cutedsl_inductor\n"
            "torch.compiler.load_cache_artifacts(open('artifacts.bin', 'rb').read())\n")
    assert run("b", prelude=load if share == "artifacts" else "") == "0"


def test_dynamic_shapes_share_one_binary():
    from cutedsl_inductor import counters
    from cutedsl_inductor.kernels.elementwise import add_template

    with one_choice_lowering(add_template, THREADS=128, VECTOR=4):
        compiled = torch.compile(lambda a, b: a + b, dynamic=True)
        for rows in (64, 96, 1000, 4096):
            x, y = (torch.randn(rows, 256, device="cuda") for _ in range(2))
            torch.testing.assert_close(compiled(x, y), x + y, rtol=0, atol=0)
    assert counters.kernels.compiled == 1


LOGS_SCRIPT = textwrap.dedent("""
    import torch
    from unittest.mock import patch
    from torch._inductor.lowering import lowerings
    from cutedsl_inductor.kernels.elementwise import add_template

    def lower(a, b):
        choices = []
        add_template.maybe_append_choice(choices, input_nodes=[a, b], layout=a.get_layout(),
                                         THREADS=128, VECTOR=4)
        return choices[0].output_node()

    x = torch.randn(64, 64, device="cuda")
    with patch.dict(lowerings, {torch.ops.aten.add.Tensor: lower}):
        torch.compile(lambda a, b: a + b)(x, x)
""")


def test_torch_logs_show_source_and_path(tmp_path):
    env = {**os.environ, "TORCH_LOGS": "output_code,kernel_code",
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    run = subprocess.run([sys.executable, "-c", LOGS_SCRIPT], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    logs = run.stdout + run.stderr
    assert "load_kernel(" in logs and "@cute.kernel" in logs
    assert "# kernel path: " in logs and "CuteDSL kernel cutedsl_elementwise_add_" in logs


@pytest.mark.parametrize("fusion", [False, True], ids=["fusion-off", "fusion-on"])
def test_consumer_of_a_template_fuses_only_where_epilogue_fusion_is_on(fusion):
    from cutedsl_inductor import config
    from cutedsl_inductor.kernels.elementwise import add_template

    x, y = (torch.randn(512, 256, device="cuda") for _ in range(2))
    with one_choice_lowering(add_template, THREADS=128, VECTOR=4), \
            config.patch(epilogue_fusion=fusion):
        result, code = compile_and_run(lambda a, b: torch.relu(a + b) * 2, x, y)
    torch.testing.assert_close(result, torch.relu(x + y) * 2, rtol=0, atol=0)
    assert "cutedsl_elementwise_add_" in code
    assert ("triton_poi_fused" in code) != fusion, "the consumer's kernel"


def test_bench_gemm_writes_each_row_as_measured(tmp_path):
    run = subprocess.run([sys.executable, "-m", "cutedsl_inductor", "bench", "gemm", "--shapes",
                          "256x512x128,128x256x512", "--dtypes", "bf16", "--layouts", "nt",
                          "--no-triton", "--out", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = (tmp_path / "gemm_bench.csv").read_text().splitlines()
    assert lines[0].startswith("m,n,k,dtype,layout,config") and len(lines) == 3
    assert lines[1].endswith(f",{torch.cuda.get_device_name()},{torch.__version__},"
                             f"{importlib.metadata.version('nvidia-cutlass-dsl')}")
    assert "geomean vs cuBLAS" in run.stdout


def test_bench_sweep_times_every_config_against_cublas():
    run = subprocess.run([sys.executable, "-m", "cutedsl_inductor", "bench", "sweep", "--shapes",
                          "256x512x128", "--ranked", "2", "--variant", "tile_k=64",
                          "--rounds", "2"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "256x512x128 nt: cuBLAS " in run.stdout and "0 failure(s)" in run.stdout
    assert "rank 0" in run.stdout and "rank -" in run.stdout  # ranked ones and variants


def test_bench_launch_times_the_host_side_of_a_call(tmp_path):
    run = subprocess.run([sys.executable, "-m", "cutedsl_inductor", "bench", "launch",
                          "--steady-only", "--out", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = json.loads((tmp_path / "launch_overhead.json").read_text())["rows"]
    assert {"CuteDSLKernelWrapper.run, static specs", "compiled graph, CuteDSL kernel"} <= {
        row[0] for row in rows}


def test_bench_epilogue_times_the_captured_variants_in_rounds(tmp_path):
    run = subprocess.run([sys.executable, "-m", "cutedsl_inductor", "bench", "epilogue",
                          "--shapes", "128x256x512", "--rounds", "2", "--out", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    with open(tmp_path / "epilogue_bench.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3 and all(row["fused"] == "True" for row in rows)
    for row in rows:
        low, mid, high = (float(row[f"vs_max_autotune{end}"]) for end in ("_min", "", "_max"))
        # the median rounds' ratio lies within the rounds' range (to rounding: with two
        # rounds it is a ratio of their means, a different division)
        assert 0 < low <= mid * (1 + 1e-12) and mid <= high * (1 + 1e-12)
        # the ceiling: max-autotune's median time over the cuBLAS GEMMs' alone
        ceiling = float(row["gemm_alone"]) / float(row["max_autotune"])
        assert float(row["ceiling"]) == pytest.approx(ceiling) and ceiling > 0
    assert "blocks (in every round on" in run.stdout


COORDESC_SCRIPT = textwrap.dedent("""
    import sys
    import torch
    import cutedsl_inductor  # noqa: F401
    from torch._dynamo.utils import counters

    x = torch.randn(4096, 1024, device="cuda")
    if sys.argv[1] == "softmax":  # over 1024 columns: one config under max-autotune
        op, want = (lambda t: torch.softmax(t * 2, -1)), torch.softmax(x * 2, -1)
    elif sys.argv[1] == "rmsnorm":  # a reduction over 8192 columns: its block may be halved
        x = torch.randn(8192, 8192, device="cuda")
        op = lambda t: t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6)  # noqa: E731
        want = op(x)
    else:  # pointwise: several configs under max-autotune
        op, want = (lambda t: (t * 2).sin() + 1), (x * 2).sin() + 1
    fn = torch.compile(op, mode="max-autotune-no-cudagraphs")
    torch.testing.assert_close(fn(x), want)
    print("coordesc", counters["inductor"]["coordesc_tuning_bench"],
          "fx_hits", counters["inductor"]["fxgraph_cache_hit"])
""")


@pytest.mark.parametrize("kernel", ["softmax", "pointwise", "rmsnorm"])
@pytest.mark.parametrize("recheck", ["1", "0"])
def test_a_warm_process_does_not_tune_a_kernel_again(tmp_path, recheck, kernel):
    """Coordinate descent tunes the compiled kernel in the cold process; the warm one (an
    FX graph cache hit) reuses its config and tunes nothing (``inductor/coordesc.py``).
    Without our fixes torch 2.11 re-tunes the single-config softmax; a several-config
    kernel whenever the cold process's tuning kept a compiled config, and a reduction
    whose block its scaling halves, so those are not asserted without them."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
           "CUTEDSL_INDUCTOR_COORDESC_RECHECK": recheck}
    counts = []
    for _ in range(2):
        run = subprocess.run([sys.executable, "-c", COORDESC_SCRIPT, kernel], cwd=ROOT, env=env,
                             capture_output=True, text=True)
        assert run.returncode == 0, run.stderr[-3000:]
        words = run.stdout.split()
        counts.append((int(words[words.index("coordesc") + 1]),
                       int(words[words.index("fx_hits") + 1])))
    (cold, cold_hits), (warm, warm_hits) = counts
    assert cold > 0 and cold_hits == 0 and warm_hits == 1, counts
    if recheck == "1":
        assert warm == 0, counts
    elif kernel == "softmax" and TORCH < (2, 13):
        assert warm > 0, counts


def test_a_triton_config_keeps_its_coordesc_mark_through_pickling():
    """What a kernel compiled in a worker process brings back (Triton's Config rebuilds
    its fields when unpickled; ``install_coordesc_reuse`` keeps the mark)."""
    import pickle

    import triton

    config = triton.Config({"XBLOCK": 128}, num_warps=8)
    config.found_by_coordesc = True
    back = pickle.loads(pickle.dumps(config))
    assert back.found_by_coordesc and back.kwargs == {"XBLOCK": 128} and back.num_warps == 8
