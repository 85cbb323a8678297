"""Upstream-style modules: ``from_dlpack`` records and ``JitOnce``'s two paths, compiled
for real without a GPU (sm_90a). A kernel is never launched on host tensors where a GPU
exists: the tests that call one expect, on a GPU-less machine, the CUDA runtime's error
at the launch, after TVM-FFI or the JitExecutor took every argument."""

import logging

import cuda.bindings.driver as cuda
import numpy as np
import pytest
import torch
import tvm_ffi

import cutlass
import cutlass.cute as cute
from cutedsl_inductor import CuteDSLTemplate, config
from cutedsl_inductor import counters
from cutedsl_inductor.compile import upstream
from cutedsl_inductor.compile.upstream import JitOnce, TensorRecord, record_dlpack
from cutedsl_inductor.exc import KernelCompileError
from cutedsl_inductor.kernels.elementwise import UPSTREAM_ADD_SOURCE
from cutlass.cute.runtime import _Tensor, from_dlpack
from tests.helpers import make_input, make_layout

no_gpu = pytest.mark.skipif(torch.cuda.is_available(),
                            reason="launches on host tensors: only where no GPU can run them")
LAUNCH_FAILS = "cudaError"  # the CUDA runtime's error at the launch, without a GPU

CALL = "{{kernel_name}}_jit(cute_a, cute_b, cute_c, cuda.CUstream(stream))"
MARKED_SOURCE = UPSTREAM_ADD_SOURCE.replace(
    "cute_a = from_dlpack(input_a)", "cute_a = from_dlpack(input_a).mark_layout_dynamic()"
).replace("cute_b = from_dlpack(input_b)", "cute_b = from_dlpack(input_b).mark_layout_dynamic()"
          ).replace("cute_c = from_dlpack({{get_output()}})",
                    "cute_c = from_dlpack({{get_output()}}).mark_layout_dynamic()")
# the entry reads an attribute of CuTe's tensor: the record converts, the JitExecutor runs
TOUCHING_SOURCE = UPSTREAM_ADD_SOURCE.replace(CALL, "m, n = cute_a.shape\n    " + CALL)


def scalar_source(rows: str) -> str:
    """The add with a Constexpr and a runtime Int32 (``rows``) after the stream."""
    return UPSTREAM_ADD_SOURCE.replace(
        "mC: cute.Tensor, stream):",
        "mC: cute.Tensor, stream, threads: cutlass.Constexpr, rows: cutlass.Int32):",
    ).replace("block=[THREADS_PER_BLOCK, 1, 1]", "block=[threads, 1, 1]").replace(
        "total_threads = m * n", "total_threads = rows * n").replace(
        CALL, CALL[:-1] + f", THREADS_PER_BLOCK, {rows})")


BROKEN_SOURCE = UPSTREAM_ADD_SOURCE.replace("m, n = mA.shape", "m, n = mA.no_such_attribute")


def launch_without_a_gpu(entry, error=RuntimeError):
    """Call ``entry`` on host tensors: it fails at the launch, every argument taken."""
    a, b, out = (torch.randn(64, 128) for _ in range(3))
    with pytest.raises(error, match=LAUNCH_FAILS):
        entry(a, b, out, stream=0)


@pytest.fixture(autouse=True)
def fresh_stats(monkeypatch):
    monkeypatch.setattr(counters, "upstream", counters.UpstreamCounts())
    monkeypatch.setattr(config, "upstream_fast_path", True)


def load(graph, source, shape=(64, 128), name="upstream_fast", **params):
    """(entry, its module's JitOnce) of ``source`` rendered for fp32 inputs of ``shape``."""
    nodes = [make_input(graph, f"arg{i}_1", shape) for i in range(2)]
    choice = CuteDSLTemplate(name, source).generate(
        input_nodes=nodes, layout=make_layout(shape), THREADS_PER_BLOCK=128, **params)
    wrapper = choice.load()
    return wrapper.kernel_fn, wrapper.kernel_fn.__globals__[f"{choice.name}_jit"]


def records(*tensors, **options):
    return tuple(record_dlpack(t, **options) for t in tensors)


def test_a_record_stands_for_from_dlpack_until_used():
    t = torch.randn(64, 128)
    record = record_dlpack(t, assumed_align=16)
    assert type(record) is TensorRecord and isinstance(record, cute.Tensor)
    assert type(record).__module__ == type(from_dlpack(t)).__module__
    assert not record._record_converted
    assert record.mark_layout_dynamic() is record and not record._record_converted
    real = from_dlpack(t, assumed_align=16).mark_layout_dynamic()
    assert record.__cache_key__ == real.__cache_key__  # converts, replaying the mark
    assert record._record_converted
    assert (record.shape, record.stride, record.dynamic_strides_mask) == (
        real.shape, real.stride, real.dynamic_strides_mask)
    assert record.data_ptr == t.data_ptr()


def test_marks_after_the_conversion_and_unhashable_marks_apply_at_once():
    t = torch.randn(64, 128)
    record = record_dlpack(t)
    with pytest.raises(RuntimeError) as ours:  # a list: no key of the fast path holds it
        record.mark_compact_shape_dynamic(mode=1, stride_order=[0, 1], divisibility=8)
    with pytest.raises(RuntimeError) as theirs:
        from_dlpack(t).mark_compact_shape_dynamic(mode=1, stride_order=[0, 1], divisibility=8)
    assert record._record_converted and str(ours.value) == str(theirs.value)
    record = record_dlpack(t)
    assert record.data_ptr == t.data_ptr() and record._record_converted
    record.mark_compact_shape_dynamic(mode=1, stride_order=(0, 1), divisibility=8)
    real = from_dlpack(t).mark_compact_shape_dynamic(mode=1, stride_order=(0, 1), divisibility=8)
    assert record.__cache_key__ == real.__cache_key__


def test_setting_an_attribute_converts_first():
    record = record_dlpack(torch.zeros(4, 8, dtype=torch.uint8))
    record.element_type = cutlass.Float4E2M1FN
    assert record._record_converted and record.element_type is cutlass.Float4E2M1FN
    assert record.__cache_key__[0] is cutlass.Float4E2M1FN


def test_what_a_record_cannot_stand_for_gets_the_real_from_dlpack():
    t = torch.randn(8, 8)
    assert type(record_dlpack(np.zeros((4, 4), np.float32))) is _Tensor
    assert type(record_dlpack(t, force_tf32=True)) is _Tensor
    assert record_dlpack(t, force_tf32=True).element_type is cutlass.TFloat32
    assert type(record_dlpack(torch.nn.Parameter(t, requires_grad=False))) is _Tensor
    assert type(record_dlpack(t, assumed_align=16.0)) is _Tensor


@pytest.mark.parametrize("refused", ["requires_grad", "conj", "sparse"])
def test_a_tensor_dlpack_refuses_takes_the_jit_path_and_raises_from_dlpacks_error(
        graph, refused):
    _, jit = load(graph, UPSTREAM_ADD_SOURCE, name="upstream_refused")
    complex_view = torch.randn(64, 128, dtype=torch.complex64).conj()
    tensor = {"requires_grad": lambda: torch.randn(64, 128).requires_grad_(),
              "conj": lambda: complex_view,
              "sparse": lambda: torch.randn(64, 128).to_sparse()}[refused]()
    others = records(torch.randn(64, 128), torch.randn(64, 128))
    assert jit.fast_function((record_dlpack(tensor), *others, cuda.CUstream(0))) is None
    with pytest.raises(Exception) as theirs:
        from_dlpack(tensor)
    with pytest.raises(Exception) as ours:
        jit(record_dlpack(tensor), *others, cuda.CUstream(0))
    assert type(ours.value) is type(theirs.value) and str(ours.value) == str(theirs.value)
    assert not jit.compiled and counters.kernels.compiled == 0


def test_records_compile_one_tvm_ffi_function_per_torch_signature(graph):
    _, jit = load(graph, UPSTREAM_ADD_SOURCE)
    assert isinstance(jit, JitOnce)
    stream = cuda.CUstream(0)
    a, b, c = (torch.randn(64, 128) for _ in range(3))
    function = jit.fast_function((*records(a, b, c), stream))
    assert isinstance(function, tvm_ffi.Function)
    assert counters.kernels.compiled == counters.upstream.fast_compiled == 1
    assert list(jit.fast) == [((torch.float32, (64, 128), (128, 1), torch.device("cpu"), torch.strided,
                               False, False, (None, False), ()),) * 3 + (cuda.CUstream,)]
    again = tuple(torch.randn(64, 128) for _ in range(3))
    assert jit.fast_function((*records(*again), cuda.CUstream(7))) is function
    assert counters.kernels.compiled == 1
    transposed = torch.randn(128, 64).t()
    assert jit.fast_function((*records(transposed, b, c), stream)) is not function
    half = tuple(x.half() for x in (a, b, c))
    jit.fast_function((*records(*half), stream))
    assert counters.kernels.compiled == counters.upstream.fast_compiled == 3
    assert not jit.compiled  # the JitExecutor path compiled nothing
    # the binary has static strides, and TVM-FFI checks them before launching anything
    with pytest.raises(ValueError, match="Mismatched mA"):
        function(transposed, b, c, stream)


def test_marked_records_share_one_function_across_shapes(graph):
    _, jit = load(graph, MARKED_SOURCE, name="upstream_marked")
    tensors = {shape: tuple(torch.randn(shape) for _ in range(3)) for shape in ((64, 128), (32, 256))}
    functions = {jit.fast_function((*(record_dlpack(t).mark_layout_dynamic() for t in ts),
                                    cuda.CUstream(0))) for ts in tensors.values()}
    assert len(jit.fast) == 2 and len(functions) == 1 and None not in functions
    assert counters.kernels.compiled == 1


def test_a_pointer_without_the_claimed_alignment_takes_the_jit_path(graph):
    _, jit = load(graph, UPSTREAM_ADD_SOURCE, name="upstream_aligned")
    base = torch.randn(64, 129)
    aligned, misaligned = base[:, :128], base[:, 1:]
    c = torch.randn(64, 128)
    assert jit.fast_function((*records(aligned, aligned, c, assumed_align=16),
                              cuda.CUstream(0))) is not None
    assert jit.fast_function((*records(misaligned, aligned, c, assumed_align=16),
                              cuda.CUstream(0))) is None


def test_cute_tensors_take_the_jit_path(graph):
    _, jit = load(graph, UPSTREAM_ADD_SOURCE, name="upstream_cute")
    a, b, c = (from_dlpack(torch.randn(64, 128)) for _ in range(3))
    assert jit.fast_function((a, b, c, cuda.CUstream(0))) is None
    mixed = (*records(torch.randn(64, 128), torch.randn(64, 128)), c, cuda.CUstream(0))
    assert jit.fast_function(mixed) is None
    assert not jit.fast and counters.kernels.compiled == 0


@no_gpu
def test_the_entry_launches_through_tvm_ffi(graph):
    entry, jit = load(graph, UPSTREAM_ADD_SOURCE, name="upstream_entry")
    launch_without_a_gpu(entry)
    assert counters.upstream.fast_calls == 1 and len(jit.fast) == 1 and not jit.compiled


@no_gpu
def test_an_entry_that_uses_a_record_takes_the_jit_path(graph):
    entry, jit = load(graph, TOUCHING_SOURCE, name="upstream_touching")
    launch_without_a_gpu(entry, Exception)
    assert len(jit.compiled) == 1 and counters.kernels.compiled == 1
    assert not jit.fast and counters.upstream.fast_compiled == counters.upstream.fast_calls == 0


@no_gpu
def test_constexpr_and_runtime_scalars_reach_tvm_ffi(graph):
    entry, jit = load(graph, scalar_source("input_a.shape[0]"), name="upstream_scalars")
    assert jit._positions == (6, (0, 1, 2, 3, 5))  # the Constexpr is not passed
    launch_without_a_gpu(entry)
    assert counters.upstream.fast_calls == 1
    key = next(iter(jit.fast))
    assert key[4:] == ((int, 128), (int, 64))


@no_gpu
def test_what_tvm_ffi_refuses_at_a_call_falls_back_to_the_jit_path(graph, caplog):
    """A float for an Int32: TVM-FFI refuses it before launching; the JitExecutor takes it
    (without the Constexpr, which its compiled function does not take either)."""
    entry, jit = load(graph, scalar_source("input_a.shape[0] + 0.5"), name="upstream_float")
    a, b, out = (torch.randn(64, 128) for _ in range(3))
    with caplog.at_level(logging.WARNING, logger="cutedsl_inductor"):
        for _ in range(2):
            with pytest.raises(Exception, match=LAUNCH_FAILS):
                entry(a, b, out, stream=0)
    assert caplog.text.count("does not take these arguments through TVM-FFI") == 1
    assert counters.upstream.fallbacks == 1 and counters.upstream.fast_calls == 1
    assert list(jit.fast.values()) == [None] and len(jit.compiled) == 1


def test_a_compile_error_is_raised_by_the_jit_path_once_the_fast_path_fell_back(graph, caplog):
    _, jit = load(graph, BROKEN_SOURCE, name="upstream_broken")
    args = (*records(*(torch.randn(64, 128) for _ in range(3))), cuda.CUstream(0))
    with caplog.at_level(logging.WARNING, logger="cutedsl_inductor"):
        for _ in range(2):
            with pytest.raises(KernelCompileError) as info:
                jit(*args)
    message = str(info.value)
    assert "'upstream_broken'" in message and "THREADS_PER_BLOCK=128" in message
    assert ".py" in message and "no_such_attribute" in message
    assert caplog.text.count("does not compile with TVM-FFI") == 1
    assert counters.upstream.fallbacks == 1 and list(jit.fast.values()) == [None]


def test_without_the_knob_the_module_keeps_from_dlpack_and_no_call_is_recorded(graph, monkeypatch):
    monkeypatch.setattr(config, "upstream_fast_path", False)
    entry, jit = load(graph, UPSTREAM_ADD_SOURCE, name="upstream_knob_off")
    assert entry.__globals__["from_dlpack"] is from_dlpack and isinstance(jit, JitOnce)
