"""Our part of Inductor's FX graph cache key: only graphs our code reaches carry it.
Importing the package, a knob and an upgrade of ours change no key of a graph they cannot
change (real Inductor compiles of CPU graphs in fresh processes, hitting each other's
cache entries); a CUDA graph that reaches our GEMM, FlexAttention or a custom lowering is
keyed by our versions and the knobs that steer it (keys of fake CUDA graphs, GPU-less)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch._inductor.codecache import compiled_fx_graph_hash
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn.attention.flex_attention import flex_attention

import cutedsl_inductor
from cutedsl_inductor import config
from cutedsl_inductor.compile import versions
from cutedsl_inductor.config import Reach
from cutedsl_inductor.inductor.cache_key import reach

ROOT = Path(__file__).resolve().parents[2]

COMPILE_SCRIPT = textwrap.dedent("""
    import json, sys
    import torch
    from torch._dynamo.utils import counters
    from torch._inductor import config as inductor_config

    mode = sys.argv[1]
    if mode != "plain":
        import cutedsl_inductor
    if mode == "knobs":
        cutedsl_inductor.config.epilogue_fusion = False
        cutedsl_inductor.config.gemm_max_configs = 3
    if sys.argv[2] == "listed":
        inductor_config.max_autotune = True
        inductor_config.max_autotune_gemm_backends = "ATEN,TRITON,CUTEDSL"

    def block(x, w, b):
        return torch.nn.functional.gelu(x @ w.t() + b) * 2

    x, w, b = torch.randn(64, 32, requires_grad=True), torch.randn(48, 32), torch.randn(48)
    out = torch.compile(block)(x, w, b)
    out.sum().backward()
    torch.testing.assert_close(out, block(x, w, b))
    print(json.dumps({**counters["inductor"], **counters["aot_autograd"]}))
""")


def run_compile(cache_dir, mode, backends="unlisted"):
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache_dir),
           "TORCHINDUCTOR_FX_GRAPH_CACHE": "1", "TORCHINDUCTOR_AUTOGRAD_CACHE": "1"}
    run = subprocess.run([sys.executable, "-c", COMPILE_SCRIPT, mode, backends], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.splitlines()[-1])


def assert_warm(counts):
    """Forward and backward from the FX graph cache, the pair from AOTAutograd's."""
    assert counts.get("fxgraph_cache_hit") == 2 and counts.get("autograd_cache_hit") == 1
    assert not counts.get("fxgraph_cache_miss") and not counts.get("fxgraph_cache_bypass")


@pytest.mark.parametrize("backends", ["unlisted", "listed"])
def test_a_cpu_graph_compiled_without_the_package_is_warm_with_it_and_its_knobs(
        tmp_path, backends):
    cold = run_compile(tmp_path, "plain", backends)
    assert cold.get("fxgraph_cache_miss") == 2 and not cold.get("fxgraph_cache_bypass")
    assert_warm(run_compile(tmp_path, "imported", backends))
    assert_warm(run_compile(tmp_path, "knobs", backends))


def fake_cuda(*shape):
    with FakeTensorMode(allow_non_fake_inputs=True):
        return torch.empty(shape, device="cuda")


GRAPH = torch.fx.symbolic_trace(lambda x: x + 1)


def key(example=None):
    return compiled_fx_graph_hash(GRAPH, [fake_cuda(4) if example is None else example],
                                  {}, [])[0]


@pytest.fixture
def gemm_listed():
    with torch._inductor.config.patch(max_autotune=True,
                                      max_autotune_gemm_backends="ATEN,TRITON,CUTEDSL"):
        yield


@pytest.fixture
def another_version(monkeypatch):
    other = {**versions.toolchain_versions(), "cutedsl_inductor sources": "edited"}
    return lambda: monkeypatch.setattr(versions, "toolchain_versions", lambda: other)


@pytest.mark.parametrize("knob, value", [("epilogue_fusion", False), ("gemm_max_configs", 3),
                                         ("gemm_exhaustive", True), ("arch", "sm_100a"),
                                         ("compile_options", "--opt-level 2")])
def test_a_cuda_graph_reaching_our_gemm_is_keyed_by_the_knobs_that_steer_it(
        gemm_listed, knob, value):
    before = key()
    assert key() == before
    with config.patch(**{knob: value}):
        assert key() != before
    with config.patch(flex_max_configs=1):  # steers FlexAttention only
        assert key() == before
    assert key() == before


def test_a_cuda_graph_reaching_our_gemm_is_keyed_by_our_versions(gemm_listed, another_version):
    before = key()
    another_version()
    assert key() != before


@pytest.mark.parametrize("device, backends", [("cpu", "ATEN,TRITON,CUTEDSL"),
                                             ("cpu", "ATEN,TRITON"),
                                             ("cuda", "ATEN,TRITON")])
def test_a_graph_reaching_nothing_of_ours_has_torchs_key(device, backends, another_version):
    """A CPU graph (CUTEDSL listed or not), a CUDA graph without CUTEDSL: no knob or
    version of ours is in its key."""
    example = fake_cuda(4) if device == "cuda" else torch.ones(4)
    with torch._inductor.config.patch(max_autotune=True, max_autotune_gemm_backends=backends):
        before = key(example)
        with config.patch(epilogue_fusion=False, gemm_max_configs=3, arch="sm_100a",
                          flex_attention=True):
            assert key(example) == before
        another_version()
        assert key(example) == before


def dynamo_graph(fn, *args):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch.compile(fn, backend=backend, fullgraph=True)(*args)
    return graphs[0]


def test_reach_finds_flex_attention_switched_on_in_a_cuda_graph(monkeypatch):
    q = torch.randn(1, 1, 128, 16)
    on = dynamo_graph(lambda q: flex_attention(q, q, q, kernel_options={"CUTEDSL": True}), q)
    off = dynamo_graph(lambda q: flex_attention(q, q, q), q)
    assert reach(on, [fake_cuda(1, 1, 128, 16)]) == Reach.FLEX
    assert reach(on, [q]) == Reach(0)  # a CPU graph
    assert reach(off, [fake_cuda(1, 1, 128, 16)]) == Reach(0)
    monkeypatch.setattr(config, "flex_attention", True)
    assert reach(off, [fake_cuda(1, 1, 128, 16)]) == Reach.FLEX


def test_reach_finds_sdpa_where_the_choice_set_is_on(monkeypatch):
    """``config.sdpa`` rewrites SDPA into our choice set (our flex kernels among it): a
    CUDA graph calling SDPA reaches us only with it on, CUTEDSL listed and max-autotune
    on; a CPU one never."""
    q = torch.randn(1, 2, 128, 16)
    graph = dynamo_graph(lambda q: torch.nn.functional.scaled_dot_product_attention(
        q, q, q, is_causal=True), q)
    cuda = [fake_cuda(1, 2, 128, 16)]
    with torch._inductor.config.patch(max_autotune=True,
                                      max_autotune_gemm_backends="ATEN,CUTEDSL"):
        assert reach(graph, cuda) & Reach.SDPA == Reach(0)
        monkeypatch.setattr(config, "sdpa", True)
        assert reach(graph, cuda) & (Reach.SDPA | Reach.FLEX) == Reach.SDPA | Reach.FLEX
        assert reach(graph, [q]) == Reach(0)  # a CPU graph
    with torch._inductor.config.patch(max_autotune=True, max_autotune_gemm_backends="ATEN"):
        assert reach(graph, cuda) == Reach(0)  # no CUTEDSL listed
    with torch._inductor.config.patch(max_autotune=False,
                                      max_autotune_gemm_backends="ATEN,CUTEDSL"):
        assert reach(graph, cuda) == Reach(0)


@torch.library.custom_op("cutedsl_test::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


twice.register_fake(lambda x: torch.empty_like(x))


def test_reach_finds_an_op_lowered_outside_torch():
    """Where a lowering of the user's is registered, a template of theirs may serve it."""
    from torch._inductor.lowering import register_lowering

    graph = dynamo_graph(lambda x: torch.ops.cutedsl_test.twice(x) + 1, torch.ones(4))
    assert reach(graph, [fake_cuda(4)]) == Reach(0)  # torch's fallback lowers it
    register_lowering(torch.ops.cutedsl_test.twice.default)(lambda x: x)
    assert reach(graph, [fake_cuda(4)]) == Reach.TEMPLATES


def test_our_passes_are_installed_and_keyed(gemm_listed):
    from torch._inductor import config as inductor_config
    from torch._inductor.codegen import common

    from cutedsl_inductor.inductor.multi_template import PreFusionPass
    from cutedsl_inductor.inductor.swiglu_pass import SwiGLUPass

    cutedsl_inductor.install()
    assert isinstance(inductor_config._pre_fusion_custom_pass, PreFusionPass)
    assert isinstance(common.custom_backend_passes["cuda"], SwiGLUPass)
    assert inductor_config.post_grad_custom_post_pass is None  # torch's, untouched
    assert inductor_config._pre_fusion_custom_pass.uuid()
    assert common.custom_backend_passes["cuda"].uuid()


CODE_SCRIPT = textwrap.dedent("""
    import sys
    import torch
    if sys.argv[1] == "imported":
        import cutedsl_inductor
    from torch._inductor.utils import run_and_get_code

    def block(x, w, b):
        return torch.nn.functional.gelu(torch.addmm(b, x, w.t())) * 2 + x.sum()

    x, w, b = torch.randn(64, 32), torch.randn(32, 32), torch.randn(32)
    with torch._inductor.config.patch(max_autotune=True, fx_graph_cache=False):
        _, (code,) = run_and_get_code(torch.compile(block), x, w, b)
    print(code)
""")


def test_importing_the_package_with_cutedsl_off_changes_no_output_code(tmp_path):
    codes = []
    for mode in ("plain", "imported"):
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / mode)}
        run = subprocess.run([sys.executable, "-c", CODE_SCRIPT, mode], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        codes.append(run.stdout.replace(str(tmp_path / mode), "<cache>"))
    assert "def call(" in codes[0] and codes[0] == codes[1]
