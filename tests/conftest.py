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
    """A fresh disk cache, an empty in-process cache and a worker pool of its own (no
    warm process carried over; its zygote and idle workers stopped at the end) for every
    test."""
    from cutedsl_inductor import config, counters
    from cutedsl_inductor.autotune import retime
    from cutedsl_inductor.compile import compiler
    from cutedsl_inductor.compile.cache import remote_cache
    from cutedsl_inductor.runtime import workers

    monkeypatch.setattr(config, "cache_dir", str(tmp_path / "kernels"))
    monkeypatch.setattr(config, "remote_cache", False)  # the remote_cache fixture: on
    for group in counters.GROUPS:  # this test's counts alone
        monkeypatch.setattr(counters, group, type(getattr(counters, group))())
    remote_cache._tier_for.cache_clear()
    monkeypatch.setattr(config, "compile_workers", 0)  # tests/runtime/test_workers.py: > 0
    monkeypatch.setattr(compiler, "_COMPILED", {})
    monkeypatch.setattr(retime, "_WINNERS", {})  # no retiming decided by an earlier test
    monkeypatch.setattr(workers, "_POOL", workers.WorkerPool())
    monkeypatch.setenv("CUTEDSL_INDUCTOR_CACHE_DIR", str(tmp_path / "kernels"))
    yield tmp_path / "kernels"
    workers.pool().shutdown()


@pytest.fixture
def graph():
    """A real Inductor GraphLowering installed as V.graph, plus an input factory."""
    import torch.fx
    from torch._inductor.graph import GraphLowering
    from torch._inductor.virtualized import V

    lowering = GraphLowering(torch.fx.symbolic_trace(lambda x: x))
    with V.set_graph_handler(lowering):
        yield lowering


@pytest.fixture
def redis_server(tmp_path):
    """A real redis-server for this test (``tests/redis_server.py``)."""
    from tests.redis_server import RedisServer

    (tmp_path / "redis").mkdir()
    server = RedisServer(tmp_path / "redis")
    yield server
    server.close()


@pytest.fixture
def remote_redis(redis_server, monkeypatch):
    """The remote tier on, at ``redis_server``."""
    from cutedsl_inductor import config

    for name, value in [("remote_cache", True), ("redis_url", None),
                        ("redis_host", "127.0.0.1"), ("redis_port", redis_server.port),
                        ("remote_cache_timeout_ms", 1000), ("remote_cache_secret_file", None)]:
        monkeypatch.setattr(config, name, value)
    return redis_server
