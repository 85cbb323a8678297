"""Kernels for Inductor's C++ wrapper: what exports (the disk cache's verified library),
and choices refused at autotuning, with the reason logged, where a kernel does not."""

import logging

import pytest
import torch
import torch.fx
from torch._inductor.graph import GraphLowering
from torch._inductor.virtualized import V

from cutedsl_inductor import config
from cutedsl_inductor.compile.exported import exported_kernel
from cutedsl_inductor.compile.cache.objects import load_library
from cutedsl_inductor.compile.specs import TensorSpec
from cutedsl_inductor.exc import NotExportableError
from cutedsl_inductor.kernels.elementwise import UPSTREAM_ADD_SOURCE, add_template
from cutedsl_inductor.template.template import CuteDSLTemplate
from tests.compile.cache.test_disk_cache import key_of
from tests.helpers import make_input, make_layout


@pytest.fixture
def cpp_graph():
    """A GraphLowering with Inductor's C++ wrapper, installed as V.graph, ``config.aot`` on."""
    graph = GraphLowering(torch.fx.symbolic_trace(lambda x: x), cpp_wrapper=True)
    with V.set_graph_handler(graph), config.patch(aot=True):
        yield graph


def choice_of(graph, template=add_template, **params):
    inputs = [make_input(graph, "arg0_1", (64, 128)), make_input(graph, "arg1_1", (64, 128))]
    choices = []
    assert template.maybe_append_choice(choices, input_nodes=inputs,
                                        layout=make_layout((64, 128)), **params) is None
    return choices[0]


def test_an_exported_kernel_is_the_cached_library_that_loads(cpp_graph):
    choice = choice_of(cpp_graph, THREADS=128, VECTOR=4)
    choice.precompile()
    assert choice.failure is None
    exported = exported_kernel(key_of(choice), choice.specs, kernel=choice.name,
                               template="elementwise_add")
    _, function = load_library(exported.library, exported.symbol.removeprefix("__tvm_ffi_"))
    assert function is not None and exported.file_name.endswith(".cutedsl")


def dropped(choice, caplog):
    with caplog.at_level(logging.WARNING, logger="cutedsl_inductor"):
        choice.precompile()
    assert isinstance(choice.failure, NotExportableError)
    assert choice.benchmark(out=None) == float("inf")
    assert "cannot be launched by Inductor's C++ wrapper" in caplog.text
    return caplog.text


def test_without_the_disk_cache_the_choice_is_refused_at_autotuning(cpp_graph, caplog):
    with config.patch(disk_cache=False):
        choice = choice_of(cpp_graph, THREADS=128, VECTOR=4)
        assert "the disk cache, which holds the exported libraries, is off" in dropped(
            choice, caplog)


def test_an_upstream_style_entry_is_refused_at_autotuning(cpp_graph, caplog):
    template = CuteDSLTemplate("aot_upstream_add", UPSTREAM_ADD_SOURCE)
    choice = choice_of(cpp_graph, template, THREADS_PER_BLOCK=128)
    assert "only @cute.jit entries export" in dropped(choice, caplog)


def test_outside_the_cpp_wrapper_nothing_is_asked_of_the_kernel(graph):
    with config.patch(disk_cache=False):
        choice = choice_of(graph, THREADS=128, VECTOR=4)
        choice.precompile()
    assert choice.failure is None


def test_a_dtype_without_a_dlpack_code_does_not_export():
    spec = TensorSpec("float8_e4m3fn", (16,), (1,), 16)
    with pytest.raises(NotExportableError, match="no DLPack type code here for float8_e4m3fn"):
        exported_kernel("0" * 64, [spec], kernel="k", template="t")
