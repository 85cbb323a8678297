"""Inductor's FX graph cache keeps working with the package imported: our passes are
keyed (``uuid``), not bypassed, with CUTEDSL among the GEMM backends or not, and a second
process hits the graph the first one compiled (CPU graphs, real Inductor)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import cutedsl_inductor
from cutedsl_inductor import config

ROOT = Path(__file__).resolve().parents[2]

COMPILE_SCRIPT = textwrap.dedent("""
    import json, sys
    import torch
    import cutedsl_inductor
    from torch._dynamo.utils import counters
    from torch._inductor import config as inductor_config

    if sys.argv[1] == "on":
        inductor_config.max_autotune = True
        inductor_config.max_autotune_gemm_backends = "ATEN,TRITON,CUTEDSL"
        cutedsl_inductor.config.epilogue_fusion = True

    def block(x, w, b):
        return torch.nn.functional.gelu(x @ w.t() + b) * 2

    x, w, b = torch.randn(64, 32), torch.randn(48, 32), torch.randn(48)
    out = torch.compile(block)(x, w, b)
    torch.testing.assert_close(out, block(x, w, b))
    print(json.dumps(dict(counters["inductor"])))
""")


def run_compile(cache_dir, cutedsl):
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache_dir),
           "TORCHINDUCTOR_FX_GRAPH_CACHE": "1"}
    run = subprocess.run([sys.executable, "-c", COMPILE_SCRIPT, cutedsl], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.splitlines()[-1])


@pytest.mark.parametrize("cutedsl", ["on", "off"])
def test_a_second_process_hits_the_fx_graph_cache(tmp_path, cutedsl):
    cold = run_compile(tmp_path, cutedsl)
    assert cold.get("fxgraph_cache_miss") == 1 and not cold.get("fxgraph_cache_bypass")
    warm = run_compile(tmp_path, cutedsl)
    assert warm.get("fxgraph_cache_hit") == 1
    assert not warm.get("fxgraph_cache_miss") and not warm.get("fxgraph_cache_bypass")


GRAPH = torch.fx.symbolic_trace(lambda x: x + 1)
EXAMPLE = [torch.ones(4)]


def fx_graph_cache_key():
    from torch._inductor.codecache import compiled_fx_graph_hash

    key, _ = compiled_fx_graph_hash(GRAPH, EXAMPLE, {}, [])
    return key


def test_our_passes_are_installed_and_keyed():
    from torch._inductor import config as inductor_config

    from cutedsl_inductor.inductor.multi_template import PreFusionPass
    from cutedsl_inductor.inductor.swiglu import SwiGLUPass

    cutedsl_inductor.install()
    assert isinstance(inductor_config._pre_fusion_custom_pass, PreFusionPass)
    assert isinstance(inductor_config.post_grad_custom_post_pass, SwiGLUPass)
    assert inductor_config._pre_fusion_custom_pass.uuid()
    assert inductor_config.post_grad_custom_post_pass.uuid()


@pytest.mark.parametrize("knob, value", [("epilogue_fusion", False), ("gemm_max_configs", 3),
                                         ("gemm_exhaustive", True), ("arch", "sm_100a"),
                                         ("compile_options", "--opt-level 2")])
def test_the_key_changes_with_knobs_that_change_generated_code(knob, value):
    cutedsl_inductor.install()
    before = fx_graph_cache_key()
    assert fx_graph_cache_key() == before
    with config.patch(**{knob: value}):
        assert fx_graph_cache_key() != before
    assert fx_graph_cache_key() == before


def test_the_key_changes_with_our_versions(monkeypatch):
    from cutedsl_inductor.compile import versions

    cutedsl_inductor.install()
    before = fx_graph_cache_key()
    other = {**versions.toolchain_versions(), "cutedsl_inductor": "0.0.0-other"}
    monkeypatch.setattr(versions, "toolchain_versions", lambda: other)
    assert fx_graph_cache_key() != before


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
