"""Inductor's lowering without a GPU: a virtual sm_90 (an H200's device properties) on
which real graphs are traced, lowered and fused, and their output code's kernels built.

Used by the benchmarks that compile on a CPU machine what a GPU machine then times
(``benchmarks/epilogue_cost.py --lower``) and by the CPU tests. Nothing is launched or
benchmarked under the virtual device: only lowering, fusion, our rendering and CuTe's
compiler run. ``virtual_sm90_patches`` lists what is replaced (torch's device queries,
Inductor's Triton check), so that a test can apply the same list with pytest's
monkeypatch; ``virtual_sm90`` applies it for a ``with`` block.
"""

from __future__ import annotations

import ast
import contextlib
from collections.abc import Callable, Iterator, Sequence
from types import SimpleNamespace
from typing import Any
from unittest import mock

import torch
from torch._dynamo import device_interface
from torch._inductor import scheduler
from torch._inductor.debug import DebugContext
from torch._inductor.decomposition import select_decomp_table
from torch._inductor.fx_passes.post_grad import post_grad_passes
from torch._inductor.graph import GraphLowering
from torch._inductor.virtualized import V
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from ..compile.specs import ScalarSpec, Sym, TensorSpec
from ..runtime.loader import load_kernel

H200_PROPERTIES = SimpleNamespace(
    name="NVIDIA H200 (virtual)", major=9, minor=0, multi_processor_count=132, warp_size=32,
    regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048,
    max_threads_per_block=1024, total_memory=141 << 30, gcnArchName="",
)


def _properties(device: Any = None) -> SimpleNamespace:
    return H200_PROPERTIES


def virtual_sm90_patches() -> list[tuple[Any, str, Any]]:
    """(object, attribute, replacement) for every query that must answer as an sm_90 GPU
    does: device properties and capability, and Triton counted as installed."""
    cuda = device_interface.CudaInterface
    return [
        (torch.cuda, "get_device_properties", _properties),
        (torch.cuda, "get_device_capability", lambda device=None: (9, 0)),
        (cuda, "get_device_properties", staticmethod(_properties)),
        (cuda.Worker, "get_device_properties", staticmethod(_properties)),
        (cuda, "get_compute_capability", staticmethod(lambda device=None: 90)),
        (scheduler, "has_triton", lambda: True),
    ]


@contextlib.contextmanager
def virtual_sm90() -> Iterator[None]:
    """Inductor treats "cuda" as an sm_90 GPU inside the block."""
    with contextlib.ExitStack() as stack:
        for target, name, replacement in virtual_sm90_patches():
            stack.enter_context(mock.patch.object(target, name, replacement))
        yield


@contextlib.contextmanager
def lowered(fn: Callable[..., Any], *shapes: tuple[int, ...],
            dtype: torch.dtype | Sequence[torch.dtype] = torch.bfloat16,
            cpp_wrapper: bool = False, post_grad: bool = False,
            aot_mode: bool = False) -> Iterator[GraphLowering]:
    """Trace ``fn`` on fake CUDA tensors of ``shapes`` (of ``dtype``, or of one dtype
    each) and lower it with Inductor (its C++ wrapper with ``cpp_wrapper``, AOTInductor's
    with ``aot_mode``, after its post-grad passes with ``post_grad``); yields the GraphLowering, installed as V.graph
    (build a Scheduler from its operations, or ``codegen()`` it)."""
    dtypes = [dtype] * len(shapes) if isinstance(dtype, torch.dtype) else list(dtype)
    mode = FakeTensorMode()
    with mode:
        args = [torch.empty(shape, device="cuda", dtype=dt) for shape, dt in zip(shapes, dtypes)]
    gm = make_fx(fn, decomposition_table=select_decomp_table(), tracing_mode="fake")(*args)
    if post_grad:
        with V.set_fake_mode(mode):
            post_grad_passes(gm, is_inference=True)
    graph = GraphLowering(gm, example_inputs=args, cpp_wrapper=cpp_wrapper or aot_mode,
                          aot_mode=aot_mode)
    with V.set_graph_handler(graph), V.set_debug_handler(DebugContext()), \
            V.set_fake_mode(mode):
        graph.run(*args)
        yield graph


def kernel_definitions(code: str) -> list[ast.Assign]:
    """The ``name = load_kernel(...)`` statements of an output module."""
    return [node for node in ast.parse(code).body
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
            and getattr(node.value.func, "id", "") == "load_kernel"]


def load_kernels(definitions: list[ast.Assign]) -> dict[str, Any]:
    """Run those statements, as the output module would (each kernel compiled, or found
    in the kernel cache); returns their namespace (kernel name -> wrapper)."""
    namespace = {"load_kernel": load_kernel, "TensorSpec": TensorSpec, "Sym": Sym,
                 "ScalarSpec": ScalarSpec}
    exec(compile(ast.Module(definitions, type_ignores=[]), "output_code", "exec"), namespace)
    return namespace
