"""Shared fixtures. Without a GPU, CuTe DSL compiles for sm_90a (set before cutlass is
imported); every test gets its own kernel cache directory; ``gpu`` tests skip."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    os.environ.setdefault("CUTEDSL_INDUCTOR_ARCH", "sm_90a")

HAS_SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs an sm_90 GPU")
    for item in items:
        if "gpu" in item.keywords and not HAS_SM90:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def kernel_cache_dir(tmp_path, monkeypatch):
    """A fresh disk cache and an empty in-process cache for every test."""
    from cutedsl_inductor import config
    from cutedsl_inductor.autotune import retime
    from cutedsl_inductor.compile import compiler

    monkeypatch.setattr(config, "cache_dir", str(tmp_path / "kernels"))
    monkeypatch.setattr(config, "compile_workers", 0)  # tests/compile/test_workers.py: > 0
    monkeypatch.setattr(compiler, "_COMPILED", {})
    monkeypatch.setattr(retime, "_WINNERS", {})  # no retiming decided by an earlier test
    monkeypatch.setattr(compiler, "stats", dict.fromkeys(compiler.stats, 0))
    monkeypatch.setenv("CUTEDSL_INDUCTOR_CACHE_DIR", str(tmp_path / "kernels"))
    return tmp_path / "kernels"


@pytest.fixture
def graph():
    """A real Inductor GraphLowering installed as V.graph, plus an input factory."""
    import torch.fx
    from torch._inductor.graph import GraphLowering
    from torch._inductor.virtualized import V

    lowering = GraphLowering(torch.fx.symbolic_trace(lambda x: x))
    with V.set_graph_handler(lowering):
        yield lowering
