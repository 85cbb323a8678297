"""CuteDSLTemplate: a Jinja2 template of CuTe DSL code whose parameter sets become
autotuning choices for Inductor (``autotune_select_algorithm``).

``generate(input_nodes=, layout=, **params)`` renders the template into a complete
module, names the kernel after the hash of what it rendered (``cutedsl_<template>_<hash>``:
the same in every process, no counters) and returns a ``CuteDSLTemplateCaller``. The
caller compiles in ``precompile`` (Inductor runs it in a thread pool), benchmarks in
``benchmark`` and becomes a ``CuteDSLTemplateBuffer`` when chosen; the scheduling pass
renders it again for the final graph, which yields the same source, so the final kernel
reuses the binary compiled while autotuning.

Names: an ASCII Python identifier, or ``TemplateNameError`` at construction (a name goes
into its kernels' names, which are Python code and then compiled symbols). The source is
trusted code: Jinja is not sandboxed, and the module it renders runs here.

Fused epilogues: a template that defines the hook (``def_epilogue``) stores the fused
result in the last consumer's dtype; which outputs it takes, ``fused_output_error``
says (by default fp32, bf16 and fp16, ``default_fused_output_error``; the GEMM adds
float8 where its store can write it, ``kernels/gemm/template.py``).

Registry: template names are global; registering a name again with the same source
returns quietly, with another source raises ``TemplateRegistryError``.

Failure semantics: ``maybe_append_choice`` returns None or the error. No choice is made,
with the reason, for inputs a kernel cannot run on (not on a CUDA device, or a GPU whose
arch the configured ``config.arch`` does not match) or under Inductor's C++ wrapper
(cpp_wrapper, AOTInductor) unless ``config.aot`` is on (then a choice whose kernel does
not export fails at autotuning, ``caller.py``). Rendering errors (bad Jinja, bad
parameter names or types, invalid Python) are logged at warning level with the template,
the parameters and the generated file, and returned.
A choice that fails to compile or run while autotuning is logged the same way and
benchmarks as ``inf``, so Inductor picks another choice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import jinja2
import torch
from torch._inductor import ir
from torch._inductor.virtualized import V

from .. import config
from ..compile.compiler import target_arch
from ..compile.records import KernelSource, Params
from ..compile.specs import Workspace, specs_for_nodes
from ..exc import (
    ChoiceError,
    CuteDSLInductorError,
    GeneratedCodeError,
    TemplateNameError,
    TemplateRegistryError,
    TemplateRenderError,
    format_params,
)
from ..runtime.loader import write_source
from .caller import CuteDSLTemplateCaller, InputView
from .defines import check_names
from .epilogue import OUTPUT_DTYPES
from .kernel import KERNEL_NAME_PLACEHOLDER, CuteDSLTemplateKernel, name_kernel

log = logging.getLogger(__name__)

GENERATE_ARGUMENTS = ("input_nodes", "layout", "mutated_inputs", "subgraphs", "workspace")
CPP_WRAPPER_UNSUPPORTED = ("Inductor's C++ wrapper (cpp_wrapper, AOTInductor) launches CuteDSL "
                           "kernels only with cutedsl_inductor.config.aot "
                           "(CUTEDSL_INDUCTOR_AOT=1)")


def default_fused_output_error(params: Params, node: Any) -> str | None:
    """Why a fused epilogue's output ``node`` is not stored: a dtype other than fp32, bf16
    and fp16; else None."""
    dtype = node.get_dtype()
    return None if dtype in OUTPUT_DTYPES else f"fused output dtype {dtype}"


class CuteDSLTemplate:
    all_templates: ClassVar[dict[str, "CuteDSLTemplate"]] = {}

    def __init__(self, name: str, source: str, *, symbolic_shapes: bool = False,
                 fused_output_error: Callable[[Params, Any], str | None] | None = None
                 ) -> None:
        """``symbolic_shapes=True`` compiles every size and stride as a runtime value
        (one binary for all shapes of a divisibility class); by default only the sizes
        Inductor keeps dynamic are runtime values. ``fused_output_error(params, node)``:
        why a choice of ``params`` cannot store a fused epilogue's output ``node`` (an IR
        buffer), or None (default: ``default_fused_output_error``)."""
        if not (isinstance(name, str) and name.isascii() and name.isidentifier()):
            raise TemplateNameError(name=name)
        existing = self.all_templates.get(name)
        if existing is not None and existing.source != source:
            raise TemplateRegistryError(name=name)
        self.name = name
        self.source = source
        self.symbolic_shapes = symbolic_shapes
        # a template that defines the epilogue hook accepts fused pointwise consumers
        self.supports_epilogue = "def_epilogue(" in source
        # one that defines the prologue hook, pointwise producers of an input
        self.supports_prologue = "def_prologue(" in source
        self.fused_output_error = fused_output_error or default_fused_output_error
        try:
            self.template = jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(source)
        except jinja2.TemplateSyntaxError as err:
            raise TemplateRenderError(
                template=name, params="(not rendered)",
                cause=f"Jinja syntax error at line {err.lineno}: {err.message}",
            ) from err
        self.all_templates[name] = self

    def maybe_append_choice(self, choices: list[Any], **kwargs: Any) -> Exception | None:
        """Append ``generate(**kwargs)`` to ``choices``; on failure log it and return
        the error (a ``CuteDSLInductorError``) instead."""
        try:
            choices.append(self.generate(**kwargs))
            return None
        except Exception as err:
            if not isinstance(err, CuteDSLInductorError):
                params = {k: v for k, v in kwargs.items() if k not in GENERATE_ARGUMENTS}
                err = ChoiceError(template=self.name, params=format_params(params),
                                  cause=f"{type(err).__name__}: {err}")
            log.warning("dropping CuteDSL choice: %s", err)
            return err

    def render(self, kernel: CuteDSLTemplateKernel) -> str:
        try:
            check_names(kernel.params)
            return kernel.render(self.template)
        except CuteDSLInductorError:  # already names the template (a SubgraphError)
            raise
        except Exception as err:
            raise TemplateRenderError(
                template=self.name, params=format_params(kernel.params),
                cause=f"{type(err).__name__}: {err}",
            ) from err

    def generate(
        self,
        input_nodes: list[Any],
        layout: ir.Layout,
        mutated_inputs: list[Any] | None = None,
        subgraphs: list[Any] | None = None,
        workspace: Workspace | None = None,
        **params: Any,
    ) -> "CuteDSLTemplateCaller":
        """One choice: ``params`` are the template's parameters; ``subgraphs`` what its
        ``{{modification(i, ...)}}`` hooks render (``template/subgraph.py``), their
        captured tensors among ``input_nodes``; ``workspace`` the scratch buffer its
        ``{{get_workspace()}}`` names."""
        reason = (CPP_WRAPPER_UNSUPPORTED if cpp_wrapper_refused()
                  else unrunnable(input_nodes, layout))
        if reason is not None:
            raise ChoiceError(template=self.name, params=format_params(params), cause=reason)
        input_nodes = [_fixed(node) for node in input_nodes]
        fake_output = ir.Buffer(name="buf_out", layout=layout)
        kernel = CuteDSLTemplateKernel(
            KERNEL_NAME_PLACEHOLDER, input_nodes, fake_output, params, subgraphs=subgraphs,
            template_name=self.name, workspace=workspace,
        )
        rendered = self.render(kernel)
        nodes = kernel.arg_nodes()
        specs = specs_for_nodes(nodes, self.symbolic_shapes)
        kernel_name, source = name_kernel(self.name, rendered, specs)
        _check_python(self.name, params, source)
        hint = V.graph.sizevars.optimization_hint
        extra_args = [hint(n) for n in nodes
                      if not hasattr(n, "get_size") and not isinstance(n, Workspace)]
        return CuteDSLTemplateCaller(
            kernel=KernelSource.of(kernel_name, source, specs, self.name, params),
            input_nodes=input_nodes,
            layout=layout,
            template=self,
            extra_args=extra_args,
            input_views=[InputView.of(node) for node in input_nodes],
            mutated_inputs=mutated_inputs,
            subgraphs=subgraphs,
            workspace=workspace,
        )


def cpp_wrapper_refused() -> bool:
    """Whether V.graph's wrapper is Inductor's C++ one and ``config.aot`` is off."""
    return bool(V.graph.cpp_wrapper) and not config.aot


def unrunnable(input_nodes: list[Any], layout: ir.Layout) -> str | None:
    """Why no CuteDSL kernel can run on these inputs and output here, or None."""
    devices = [node.get_device() for node in input_nodes] + [layout.device]
    elsewhere = sorted({str(d) for d in devices if d is None or d.type != "cuda"})
    if elsewhere:
        return (f"its inputs or output are on {', '.join(elsewhere)}; CuteDSL kernels run on "
                "CUDA GPUs only")
    arch = target_arch()
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(devices[-1])
        if not arch.startswith(f"sm_{major}{minor}"):
            return (f"its kernels are compiled for {arch} (cutedsl_inductor.config.arch), "
                    f"which this GPU (sm_{major}{minor}) cannot run")
    return None


def _fixed(node: Any) -> Any:
    """Template inputs need final strides: freeze a flexible layout."""
    if isinstance(node.get_layout(), ir.FlexibleLayout):
        node.freeze_layout()
    return node


def _check_python(template: str, params: Mapping[str, Any], source: str) -> None:
    """Valid Python, and embeddable in the output code as a raw ''' string."""
    try:
        compile(source, f"<cutedsl template {template}>", "exec")
        if "'''" in source or source.endswith("\\"):
            raise SyntaxError("the source contains ''' or ends with a backslash")
    except SyntaxError as err:
        _, path = write_source(source)
        where = f" at line {err.lineno}" if err.lineno else ""
        raise GeneratedCodeError(
            template=template, params=format_params(params), cause=f"{err.msg}{where}",
            path=path,
        ) from err

