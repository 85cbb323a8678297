"""What ``install()`` hooks into dynamo: the compile workers' zygote starts with a compile
that lists CUTEDSL and is stopped at its end when it forked no worker, and a warm
process (a compile served from Inductor's caches) starts none ahead again."""

import pytest
import torch

from cutedsl_inductor import config
from cutedsl_inductor.inductor.install import _start_workers_ahead, install_workers_ahead
from cutedsl_inductor.runtime import workers


@pytest.fixture
def compile_with_workers(monkeypatch):
    """torch.compile of a CPU function with a backend that records the zygote while
    Inductor would be lowering (between dynamo's start and end callbacks)."""
    monkeypatch.setattr(config, "compile_workers", 2)
    torch._dynamo.reset()  # dynamo's reset drops callbacks; install them again
    install_workers_ahead()
    seen = []

    def backend(gm, example_inputs):
        seen.append(workers.pool().zygote)
        return gm.forward

    def run(backends):
        compiled = len(seen)
        with torch._inductor.config.patch(max_autotune_gemm_backends=backends):
            # a size of its own each time: a compile, not a cached frame
            torch.compile(lambda x: x.sin() + 1, backend=backend, dynamic=False)(
                torch.ones(4 + compiled))
        assert len(seen) == compiled + 1
        return seen[-1]

    return run


def test_a_compile_listing_cutedsl_starts_the_zygote_and_stops_it_unused(compile_with_workers):
    during = compile_with_workers("ATEN,TRITON,CUTEDSL")
    assert during is not None and during.arch == "sm_90a"
    assert workers.pool().zygote is None  # it forked no worker
    assert during.process.returncode is not None  # stopped, not left importing
    # no cache served it (not even Inductor ran): the next compile starts one again
    assert compile_with_workers("ATEN,TRITON,CUTEDSL") is not None


def fn(x, w):
    return torch.relu(x @ w) * 2


def test_a_compile_served_from_inductors_cache_starts_none_ahead_again(
        compile_with_workers, tmp_path, monkeypatch):
    """A cold Inductor compile that built nothing stops the zygote; once a compile was
    an FX graph cache hit (a warm process), later compiles start none ahead."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    args = torch.randn(8, 16), torch.randn(16, 4)
    with torch._inductor.config.patch(max_autotune_gemm_backends="ATEN,CUTEDSL"):
        torch.compile(fn)(*args)  # a miss
        assert workers.pool().zygote is None and not workers.pool().stopped_unused
        torch._dynamo.reset()  # the same graph again, from the cache
        install_workers_ahead()
        torch.compile(fn)(*args)
    assert workers.pool().zygote is None and workers.pool().stopped_unused
    assert compile_with_workers("ATEN,CUTEDSL") is None


def test_a_compile_without_cutedsl_starts_no_zygote(compile_with_workers):
    assert compile_with_workers("ATEN,TRITON") is None


def test_a_zygote_that_forked_workers_outlives_the_compile(compile_with_workers):
    install_workers_ahead()  # idempotent
    assert torch._dynamo.callback_handler.start_callbacks.count(_start_workers_ahead) == 1
    workers.pool().start_zygote()
    zygote = workers.pool().zygote
    workers.pool().start_workers(zygote.arch)
    assert workers.pool().running == 2
    assert compile_with_workers("ATEN,CUTEDSL") is zygote
    assert workers.pool().zygote is zygote and zygote.process.poll() is None
