"""Loading generated modules: both entry styles, with real GPU-less compiles."""

import logging
import sys

import pytest
import torch
import tvm_ffi

from cutedsl_inductor import CuteDSLKernelWrapper, CuteDSLTemplate
from cutedsl_inductor.compile.specs import Sym, TensorSpec
from cutedsl_inductor.compile.upstream import JitOnce
from cutedsl_inductor.exc import GeneratedCodeError, KernelArgumentError, KernelCompileError
from cutedsl_inductor.kernels.elementwise import UPSTREAM_ADD_SOURCE, add_template
from cutedsl_inductor.runtime.loader import load_kernel
from cutedsl_inductor.runtime.wrapper import InductorEntryWrapper, TVMFFIKernelWrapper
from tests.helpers import make_input, make_layout

BROKEN_SOURCE = r'''
{{gen_defines()}}

@cute.jit
{{def_kernel("a", "b")}}
    x = a.no_such_attribute
'''


def inputs(graph, shape=(64, 128)):
    return [make_input(graph, "arg0_1", shape), make_input(graph, "arg1_1", shape)]


def test_jit_entry_compiles_to_a_tvm_ffi_launcher(graph):
    choice = add_template.generate(input_nodes=inputs(graph), layout=make_layout((64, 128)),
                                   THREADS=256, VECTOR=4)
    wrapper = choice.load()
    assert isinstance(wrapper, TVMFFIKernelWrapper)
    assert isinstance(wrapper.kernel_fn, tvm_ffi.Function)
    assert wrapper.kernel_path.endswith(".py")


def test_upstream_style_template_loads_unchanged(graph):
    template = CuteDSLTemplate("upstream_add", UPSTREAM_ADD_SOURCE)
    choice = template.generate(input_nodes=inputs(graph), layout=make_layout((64, 128)),
                               THREADS_PER_BLOCK=128)
    wrapper = choice.load()
    assert type(wrapper) is CuteDSLKernelWrapper
    module = wrapper.kernel_fn.__globals__
    assert isinstance(module[f"{choice.name}_jit"], JitOnce)
    assert "cuda.CUstream(stream)" in open(wrapper.kernel_path).read()


def test_inductors_output_code_launches_an_upstream_style_entry_unchecked(graph):
    """Static specs: Inductor lays out what it passes as they say, so its output code's
    wrapper calls the entry directly; a direct caller's wrapper checks (here: a host
    tensor where the specs want CUDA ones)."""
    template = CuteDSLTemplate("upstream_add_unchecked", UPSTREAM_ADD_SOURCE)
    choice = template.generate(input_nodes=inputs(graph), layout=make_layout((64, 128)),
                               THREADS_PER_BLOCK=128)
    ours = load_kernel(choice.name, choice.source, choice.specs, inductor=True)
    theirs = load_kernel(choice.name, choice.source, choice.specs)
    assert type(ours) is InductorEntryWrapper and type(theirs) is CuteDSLKernelWrapper
    assert ours.kernel_fn is theirs.kernel_fn
    a, b, out = (torch.randn(64, 128) for _ in range(3))
    with pytest.raises(KernelArgumentError, match="expected a CUDA tensor"):
        theirs.run(a, b, out, stream=0)
    symbolic = [TensorSpec("float32", (Sym("s0"), 128), (128, 1), 16) for _ in choice.specs]
    assert type(load_kernel(choice.name, choice.source, symbolic, inductor=True)) \
        is CuteDSLKernelWrapper


def test_missing_entry_point_is_a_clear_error():
    with pytest.raises(GeneratedCodeError, match="no entry point 'k1_main'"):
        load_kernel("k1", "def helper():\n    pass\n", [], template="t", params={"A": 1})


def test_compile_error_names_template_params_and_file(graph, caplog):
    template = CuteDSLTemplate("broken_kernel", BROKEN_SOURCE)
    choice = template.generate(input_nodes=inputs(graph), layout=make_layout((64, 128)),
                               TILE=64)
    with pytest.raises(KernelCompileError) as info:
        load_kernel(choice.name, choice.source, choice.specs, template="broken_kernel",
                    params={"TILE": 64})
    message = str(info.value)
    assert "'broken_kernel'" in message and "TILE=64" in message and ".py" in message
    assert "sm_90a" in message


def test_failing_choice_is_dropped_not_raised(graph, caplog):
    template = CuteDSLTemplate("broken_choice", BROKEN_SOURCE)
    choice = template.generate(input_nodes=inputs(graph), layout=make_layout((64, 128)),
                               TILE=32)
    with caplog.at_level(logging.WARNING, logger="cutedsl_inductor"):
        choice.precompile()
    assert isinstance(choice.failure, KernelCompileError)
    assert "dropping CuteDSL choice" in caplog.text and "TILE=32" in caplog.text
    assert choice.benchmark(out=None) == float("inf")


def test_what_runs_is_the_rendered_source_not_the_file(graph, tmp_path, caplog):
    """The generated file in Inductor's cache is written by anyone who can write there:
    the loader executes the source it holds, restores the file, and CuTe DSL (which reads
    its functions' source through linecache) sees the rendered text."""
    import inspect
    from pathlib import Path

    from cutedsl_inductor.runtime.loader import write_source

    choice = add_template.generate(input_nodes=inputs(graph, (32, 96)),
                                   layout=make_layout((32, 96)), THREADS=64, VECTOR=2)
    _, path = write_source(choice.source)
    marker = tmp_path / "ran"
    Path(path).write_text(f"open({str(marker)!r}, 'w').close()\n{choice.source}")
    wrapper = choice.load()
    assert isinstance(wrapper.kernel_fn, tvm_ffi.Function) and wrapper.origin == "compiled"
    assert not marker.exists()
    assert "differs from the kernel's; writing it again" in caplog.text
    assert Path(path).read_text() == choice.source
    Path(path).write_text("# edited after loading\n")
    module = sys.modules[f"cutedsl_inductor.generated.{Path(path).stem}"]
    entry = getattr(module, f"{choice.name}_main")
    assert inspect.getsource(entry) in choice.source
