"""Upstream-style templates on an sm_90 GPU (marker ``gpu``): ``from_dlpack`` records
launched through TVM-FFI (``compile/upstream.py``), inside torch.compile and called
directly, on the stream the caller gives; fresh random inputs every call."""

import pytest
import torch

from tests.gpu.test_e2e import one_choice_lowering

pytestmark = pytest.mark.gpu

SHAPE = (4096, 512)


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    from cutedsl_inductor import config, counters

    monkeypatch.setattr(counters, "upstream", counters.UpstreamCounts())
    monkeypatch.setattr(config, "upstream_fast_path", True)
    torch._dynamo.reset()
    yield counters.upstream
    torch._dynamo.reset()


def template(name, source=None):
    from cutedsl_inductor import CuteDSLTemplate
    from cutedsl_inductor.kernels.elementwise import UPSTREAM_ADD_SOURCE

    return CuteDSLTemplate(name, source or UPSTREAM_ADD_SOURCE)


def loaded_entry(name, source, shape=SHAPE, dtype=torch.float32):
    """The plain entry of ``source`` (template ``name``: names are global, one per source)
    rendered for ``shape``: called directly, without the wrapper's spec check, so one
    module sees several argument signatures."""
    from cutedsl_inductor.autotune.scratch import scratch_graph

    with scratch_graph() as scratch:
        a, b = (scratch.input(shape, dtype) for _ in range(2))
        return template(name, source).generate(
            input_nodes=[a, b], layout=a.get_layout(), THREADS_PER_BLOCK=256).load().kernel_fn


def call(entry, a, b):
    out = torch.empty_like(a)
    entry(a, b, out, stream=torch.cuda.current_stream().cuda_stream)
    return out


def delayed_inputs(*tensors):
    """Copies of ``tensors`` written on the current stream after the GPU sleeps there: a
    kernel launched on any other stream reads zeros."""
    copies = [torch.zeros_like(t) for t in tensors]
    torch.cuda.synchronize()
    torch.cuda._sleep(50_000_000)
    for copy, t in zip(copies, tensors):
        copy.copy_(t)
    return copies


def test_in_a_compiled_graph_it_launches_through_tvm_ffi_and_matches_torch(fresh):
    from cutedsl_inductor import counters

    with torch._inductor.config.patch(fx_graph_cache=False, max_autotune=False), \
            one_choice_lowering(template("upstream_graph"), THREADS_PER_BLOCK=256):
        fn = torch.compile(lambda a, b: a + b, dynamic=False)
        for _ in range(3):
            x, y = (torch.randn(SHAPE, device="cuda") for _ in range(2))
            torch.testing.assert_close(fn(x, y), x + y, rtol=0, atol=0)
    assert fresh["fast_calls"] == 3 and fresh["fast_compiled"] == 1 and not fresh["fallbacks"]
    assert counters.kernels.compiled == 1  # nothing on the JitExecutor path


def test_in_a_compiled_graph_it_launches_on_the_current_side_stream(fresh):
    with torch._inductor.config.patch(fx_graph_cache=False, max_autotune=False), \
            one_choice_lowering(template("upstream_side"), THREADS_PER_BLOCK=256):
        fn = torch.compile(lambda a, b: a + b, dynamic=False)
        x, y = (torch.randn(SHAPE, device="cuda") for _ in range(2))
        fn(x, y)
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            a, b = delayed_inputs(x, y)
            result = fn(a, b)
        side.synchronize()
    torch.testing.assert_close(result, x + y, rtol=0, atol=0)
    assert fresh["fast_calls"] == 2


@pytest.mark.parametrize("variant", ["transposed", "bfloat16", "float16"])
def test_in_a_compiled_graph_other_strides_and_dtypes_compile_again(fresh, variant):
    make = {"transposed": lambda: torch.randn(SHAPE[::-1], device="cuda").t(),
            "bfloat16": lambda: torch.randn(SHAPE, device="cuda", dtype=torch.bfloat16),
            "float16": lambda: torch.randn(SHAPE, device="cuda", dtype=torch.float16)}[variant]
    with torch._inductor.config.patch(fx_graph_cache=False, max_autotune=False), \
            one_choice_lowering(template(f"upstream_{variant}"), THREADS_PER_BLOCK=256):
        fn = torch.compile(lambda a, b: a + b, dynamic=False)
        x, y = (torch.randn(SHAPE, device="cuda") for _ in range(2))
        torch.testing.assert_close(fn(x, y), x + y, rtol=0, atol=0)
        for _ in range(2):
            p, q = make(), make()
            torch.testing.assert_close(fn(p, q), p + q, rtol=0, atol=0)
    assert fresh["fast_compiled"] == 2 and fresh["fast_calls"] == 3 and not fresh["fallbacks"]


def test_one_module_compiles_once_per_signature_and_runs_each_correctly(fresh):
    entry = loaded_entry("upstream_direct", None)
    signatures = [lambda: torch.randn(SHAPE, device="cuda"),
                  lambda: torch.randn(SHAPE[::-1], device="cuda").t(),
                  lambda: torch.randn(SHAPE, device="cuda", dtype=torch.bfloat16),
                  lambda: torch.randn(SHAPE, device="cuda")]
    for make in signatures:
        a, b = make(), make()
        torch.testing.assert_close(call(entry, a, b), a + b, rtol=0, atol=0)
    assert fresh["fast_compiled"] == 3 and fresh["fast_calls"] == 4
    side = torch.cuda.Stream()
    x, y = (torch.randn(SHAPE, device="cuda") for _ in range(2))
    with torch.cuda.stream(side):
        a, b = delayed_inputs(x, y)
        result = call(entry, a, b)
    side.synchronize()
    torch.testing.assert_close(result, x + y, rtol=0, atol=0)
    assert fresh["fast_compiled"] == 3


def test_dynamic_marks_share_one_function_across_shapes(fresh):
    from tests.compile.test_upstream import MARKED_SOURCE

    entry = loaded_entry("upstream_marked", MARKED_SOURCE)
    for shape in (SHAPE, (1000, 300), (7, 4099)):
        a, b = (torch.randn(shape, device="cuda") for _ in range(2))
        torch.testing.assert_close(call(entry, a, b), a + b, rtol=0, atol=0)
    assert fresh["fast_compiled"] == 1 and fresh["fast_calls"] == 3


def test_an_entry_that_uses_a_record_runs_on_the_jit_path(fresh):
    from tests.compile.test_upstream import TOUCHING_SOURCE, scalar_source

    for name, source in (("upstream_touching", TOUCHING_SOURCE),
                         ("upstream_scalar", scalar_source("input_a.shape[0] + 0.25"))):
        entry = loaded_entry(name, source)
        a, b = (torch.randn(SHAPE, device="cuda") for _ in range(2))
        torch.testing.assert_close(call(entry, a, b), a + b, rtol=0, atol=0)
    assert fresh["fast_compiled"] == 1  # the scalar source's, refused at its call
    assert fresh["fallbacks"] == 1
