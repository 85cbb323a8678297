"""CuteDSLTemplateCaller: one template x parameter set as an Inductor ``ChoiceCaller``.

``precompile`` compiles the choice (Inductor calls it from a thread pool before
benchmarking; with ``config.compile_prefetch`` its build starts when it is made:
``runtime/workers.py``), ``benchmark`` times it on Inductor's example tensors (``fastest_ms``,
see ``autotune/benchmark_request.py``), ``output_node`` turns the winner into a
``CuteDSLTemplateBuffer``. ``hash_key`` is the template name
and the hash of the rendered source and argument specs, identical in every process.
``bmreq`` is the same choice as a picklable request, for Inductor's tuning subprocess
(``autotune/benchmark_request.py``).

Failure semantics: a choice that fails to load, compile or run is logged at warning
level (template, parameters, generated file, reason), remembered as failed, and
benchmarks as ``inf``; Inductor then picks another choice. So is one made for Inductor's
C++ wrapper whose kernel does not export (``compile/exported.py``), with the reason.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
from typing import Any

import torch
from torch._inductor import ir
from torch._inductor.autotune_process import TensorMeta
from torch._inductor.virtualized import V

from ..autotune.benchmark_request import (
    CuteDSLBenchmarkRequest,
    argument_meta,
    fastest_ms,
    workspace_call,
)
from ..compile import versions
from ..compile.records import KernelSource, Params
from ..compile.specs import ArgSpec, Workspace, specs_key
from ..runtime import workers
from ..runtime.loader import load, load_exported
from .buffer import CuteDSLTemplateBuffer
from .epilogue import IDENTITY, EpiloguePlan
from .kernel import KERNEL_NAME_PLACEHOLDER, CuteDSLTemplateKernel

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class InputView:
    """How one template input sits in its buffer (size hints, in elements)."""

    buffer: str
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int

    @staticmethod
    def of(node: Any) -> "InputView":
        hints = V.graph.sizevars.optimization_hints
        layout = node.get_layout()
        return InputView(node.get_name(), tuple(hints(node.get_size())),
                         tuple(hints(node.get_stride())),
                         V.graph.sizevars.optimization_hint(layout.offset))


class KernelRender:
    """``make_kernel_render`` of a chosen template: builds the kernel for the final
    output node; ``render()`` then returns source with the name placeholder in it."""

    def __init__(self, template: Any, input_nodes: list[Any], params: Params,
                 subgraphs: list[Any] | None = None, workspace: Workspace | None = None):
        self.template = template
        self.input_nodes = input_nodes
        self.params = params
        self.subgraphs = subgraphs
        self.workspace = workspace

    def __call__(self, out_node: Any, hint_override: int | None = None,
                 epilogue: EpiloguePlan = IDENTITY, prologue: Any = None) -> tuple[Any, Any]:
        kernel = CuteDSLTemplateKernel(
            KERNEL_NAME_PLACEHOLDER, self.input_nodes, out_node, self.params, epilogue,
            subgraphs=self.subgraphs, template_name=self.template.name, prologue=prologue,
            workspace=self.workspace,
        )
        return kernel, functools.partial(self.template.render, kernel)


class CuteDSLTemplateCaller(ir.ChoiceCaller):
    def __init__(
        self,
        kernel: KernelSource,
        input_nodes: list[Any],
        layout: ir.Layout,
        template: Any,
        extra_args: list[int],
        input_views: list[InputView],
        mutated_inputs: list[Any] | None = None,
        subgraphs: list[Any] | None = None,
        workspace: Workspace | None = None,
    ) -> None:
        super().__init__(
            name=kernel.name,
            input_nodes=input_nodes,
            layout=layout,
            description=f"CuteDSL {template.name} ({kernel.params})",
        )
        self.template = template
        self.kernel = kernel
        self.extra_args = extra_args
        self.input_views = input_views
        self.mutated_inputs = mutated_inputs
        self.workspace = workspace
        self.make_kernel_render = KernelRender(template, input_nodes, kernel.params,
                                               subgraphs, workspace)
        # Inductor's picklable request, for autotuning in a subprocess
        self.bmreq = CuteDSLBenchmarkRequest(
            kernel.name,
            [argument_meta(node, view.size, view.stride)
             for node, view in zip(input_nodes, input_views)],
            TensorMeta.from_irnodes(layout), extra_args, kernel=kernel, workspace=workspace,
        )
        self.failure: Exception | None = None
        self._wrapper: Any = None
        # made for Inductor's C++ wrapper: only a kernel it can launch is a choice
        self.exported = bool(V.graph.cpp_wrapper)
        workers.pool().prefetch(self.bmreq)

    @property
    def source(self) -> str:
        return self.kernel.source

    @property
    def specs(self) -> tuple[ArgSpec, ...]:
        return self.kernel.specs

    @property
    def params(self) -> Params:
        return self.kernel.params

    # -- autotuning ----------------------------------------------------------------

    def load(self) -> Any:
        """The kernel's wrapper; for the C++ wrapper, ``NotExportableError`` where the
        kernel does not export (``runtime.loader.load_exported``)."""
        if self._wrapper is None:
            wrapper = load(self.kernel)
            if self.exported:
                load_exported(self.kernel)
            self._wrapper = wrapper
        return self._wrapper

    def precompile(self) -> None:
        """Inductor calls this from its thread pool: the compile itself runs in one of
        our worker processes where there are any (``runtime/workers.py``)."""
        try:
            workers.pool().build(self.bmreq)
            self.load()
        except Exception as err:
            self._drop(err)

    def benchmark(self, *args: Any, out: torch.Tensor) -> float:
        if self.failure is not None:
            return float("inf")
        from torch._inductor.runtime.benchmarking import benchmarker

        try:
            wrapper = self.load()
            stream = torch.cuda.current_stream(out.device).cuda_stream
            call = workspace_call(wrapper, self.workspace, (*self.views_of(args), out),
                                  self.extra_args, stream)
            call()  # surfaces launch errors here
            return fastest_ms(lambda: benchmarker.benchmark_gpu(call), call,
                              self.bmreq.settle_ms, out.device)
        except Exception as err:
            self._drop(err)
            return float("inf")

    def views_of(self, buffers: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
        """Inductor benchmarks a template with one tensor per distinct input buffer (in
        order of first use); our entry takes each input as its view (a transposed
        operand, an expanded bias), rebuilt here from the IR layouts."""
        names = list(dict.fromkeys(view.buffer for view in self.input_views))
        if len(buffers) != len(names):
            raise ValueError(f"{len(buffers)} benchmark tensors for input buffers {names}")
        by_name = dict(zip(names, buffers))
        return [by_name[v.buffer].as_strided(v.size, v.stride,
                                             by_name[v.buffer].storage_offset() + v.offset)
                for v in self.input_views]

    def _drop(self, err: Exception) -> None:
        self.failure = err
        log.warning(
            "dropping CuteDSL choice %s (template %r, parameters [%s]): %s",
            self.name, self.template.name, self.params, err,
        )

    # -- ChoiceCaller interface ----------------------------------------------------

    def output_node(self) -> ir.TensorBox:
        return ir.TensorBox.create(
            CuteDSLTemplateBuffer(
                layout=self.layout,
                inputs=self.input_nodes,
                make_kernel_render=self.make_kernel_render,
                template=self.template,
                params=self.params,
                mutated_inputs=self.mutated_inputs,
            )
        )

    def call_name(self) -> str:
        return self.name

    def to_callable(self) -> Any:
        return self.load().run

    def hash_key(self) -> str:
        """Names the binary: Inductor's autotune-result cache keys timings on it."""
        material = f"{self.source}\n{specs_key(self.specs)}\n{sorted(versions.toolchain_versions().items())}"
        return f"{self.template.name}-{hashlib.sha256(material.encode()).hexdigest()}"

    def info_dict(self) -> dict[str, Any]:
        return {
            "backend": "CuteDSL",
            "template": self.template.name,
            "kernel_name": self.name,
            **{k: str(v) for k, v in self.params.items()},
        }

    def autoheuristic_id(self) -> str:
        return f"cutedsl_{self.template.name}_" + "_".join(
            f"{k}={v}" for k, v in self.params.items()
        )

    def __str__(self) -> str:
        return f"CuteDSLTemplateCaller({self.name})"
