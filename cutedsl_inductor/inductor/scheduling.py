"""CuteDSLScheduling: code generation for ``CuteDSLTemplateBuffer``. Inductor reaches it
through ``CuteDSLCombinedScheduling`` (``combined.py``), which ``install.py`` registers
for "cuda": it routes our template nodes here and leaves every other node to Inductor.

The output code gets one definition per kernel::

    cutedsl_<template>_<hash> = load_kernel('<name>', r'''<CuTe DSL source>''',
                                            specs=[TensorSpec(...), ...], ...)

and a call ``cutedsl_<template>_<hash>.run(<args>, stream=streamN)``. The source is
also written to a real ``.py`` file, whose path the definition's comment names. Under
Inductor's C++ wrapper (``config.aot``) the definition and the call are C++
(``cpp_launch.py``), and a fusion is made only where the fused kernel exports.

Fusion: with ``config.epilogue_fusion`` on, a pointwise consumer fuses into a template
that defines an epilogue (``template/epilogue.py``; max-autotune's deferred choices that
we win are finalized before fusion, ``multi_template.py``) once the fused kernel has
compiled (cached, so the output code reuses it; one that fails stays unfused, with a
warning). A pointwise producer of an input joins a template that defines a prologue
(``template/prologue.py``) only through our pre-fusion step (``inductor/prologue.py``,
which times it), never through Inductor's own prologue fusion: every other fusion
question about our nodes is answered "no", on every supported torch. The fused
prologue travels on the template buffer (``buffer.prologue``), so every render of it
(fusing an epilogue, the final code) includes it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
from torch._inductor.codegen.common import WorkspaceArg, WorkspaceZeroMode
from torch._inductor.scheduler import BaseScheduling, SchedulerNode
from torch._inductor.utils import get_kernel_metadata
from torch._inductor.virtualized import V
from torch.utils._ordered_set import OrderedSet

from .. import config
from . import cpp_launch
from ..compile.records import KernelSource
from ..compile.specs import Workspace, specs_for_nodes
from ..runtime.loader import load, load_exported, write_source
from ..template.buffer import CuteDSLTemplateBuffer
from ..template.epilogue import IDENTITY, EpiloguePlan, plan_epilogue
from ..template.kernel import name_kernel
from ..template.prologue import ProloguePlan, plan_prologue

log = logging.getLogger(__name__)


# What a fusion saves, where it is estimated before timing: the bytes it keeps out of
# memory at this fraction of the HBM bandwidth, and one launch as seen in a CUDA graph.
_BYTES_PER_MS = 3.5e9
_LAUNCH_MS = 0.002


def fusion_estimate_ms(nbytes: float) -> float:
    """The estimated saving of a fusion that keeps ``nbytes`` out of memory."""
    return nbytes / _BYTES_PER_MS + _LAUNCH_MS


def is_cutedsl_template(node: Any) -> bool:
    return isinstance(node, SchedulerNode) and isinstance(node.node, CuteDSLTemplateBuffer)


class CuteDSLScheduling(BaseScheduling):
    def __init__(self, scheduler: Any) -> None:
        super().__init__(scheduler)
        self._failed_sources: set[str] = set()

    @classmethod
    def get_backend_features(cls, device: Any) -> Any:
        return OrderedSet()

    def can_fuse_vertical(self, node1: Any, node2: Any) -> bool:
        """A pointwise consumer joins a template's epilogue (``config.epilogue_fusion``)
        when the template defines one, every buffer the fused kernel would no longer
        write is used only inside it, and the consumer translates."""
        return config.epilogue_fusion and self.epilogue_plan(
            [*node1.get_nodes(), *node2.get_nodes()]) is not None

    def can_fuse_horizontal(self, node1: Any, node2: Any) -> bool:
        return False

    def epilogue_plan(self, nodes: list[Any]) -> EpiloguePlan | None:
        """The plan for a template node (after its fused prologue, if any) followed by
        pointwise consumer nodes, or None."""
        nodes = _from_template(nodes)
        if not nodes:
            return None
        template_node, *consumers = nodes
        if not is_cutedsl_template(template_node) or not consumers:
            return None
        if not template_node.node.template.supports_epilogue:
            return None
        if any(not isinstance(n, SchedulerNode) or n.is_template() or n.is_reduction()
               for n in consumers):
            return None
        group = OrderedSet(n.get_name() for n in nodes)
        for node in nodes[:-1]:  # only the last node's buffer is written
            if not all(self.scheduler.can_buffer_be_removed_through_fusion(name, group)
                       for name in node.get_buffer_names()):
                return None
        try:
            plan = plan_epilogue(template_node.node, [n.node for n in consumers])
        except Exception as err:  # not fusable: the nodes stay unfused, never a crash
            log.debug("not fusing into %s: %s", template_node.get_name(), err)
            return None
        return plan if self.fused_kernel_compiles(template_node.node, plan) else None

    def prologue_plan(self, producer: Any, template_node: Any) -> ProloguePlan | None:
        """The plan for pointwise ``producer`` (a scheduler node whose only user is
        ``template_node``, one of ours) in the template's load path, or None (logged at
        debug): a template without the hook, a producer that does not translate, a choice
        that claims no prologue on that input, a fused kernel that does not compile."""
        buffer = template_node.node
        if not buffer.template.supports_prologue:
            return None
        try:
            if not isinstance(producer, SchedulerNode) or producer.is_template() or \
                    producer.is_reduction() or producer.has_aliasing_or_mutation():
                raise NotImplementedError("not a plain pointwise node")
            plan = plan_prologue(buffer, producer.node)
            render_kernel(buffer, IDENTITY, plan)  # the choice claims the input, or raises
        except Exception as err:  # not fusable: the nodes stay unfused, never a crash
            log.debug("not fusing %s as a prologue of %s: %s", producer.get_name(),
                      template_node.get_name(), err)
            return None
        return plan if self.fused_kernel_compiles(buffer, IDENTITY, plan) else None

    def fused_kernel_compiles(self, buffer: CuteDSLTemplateBuffer, plan: EpiloguePlan,
                              prologue: Any = None) -> bool:
        """Compile the fused kernel now, before the fusion is decided: the autotuner only
        ever compiled the template alone. The compile is cached (the output code then
        loads it for free); a template whose fused kernel fails to compile stays unfused,
        with a warning that names the template, parameters and generated file."""
        rendered = render_kernel(buffer, plan, prologue)[1]
        if rendered.source in self._failed_sources:
            return False
        try:
            (load_exported if V.graph.cpp_wrapper else load)(rendered)
        except Exception as err:  # the nodes stay unfused, never a crash
            self._failed_sources.add(rendered.source)
            log.warning("not fusing %s into %s: %s",
                        "a prologue" if prologue is not None else "an epilogue", rendered.name,
                        err)
            return False
        return True

    def codegen_template(
        self,
        template_node: Any,
        epilogue_nodes: Sequence[Any],
        prologue_nodes: Sequence[Any],
        *args: Any,
        **kwargs: Any,
    ) -> None:
        buffer: CuteDSLTemplateBuffer = template_node.node
        fused_prologue = [buffer.prologue.target] if buffer.prologue is not None else []
        written = [name for n in prologue_nodes for name in n.get_buffer_names()]
        if written != fused_prologue:
            raise NotImplementedError(f"prologue nodes writing {written} are not the "
                                      "template's fused prologue")
        plan = IDENTITY
        if epilogue_nodes:
            for node in epilogue_nodes:
                node.node.freeze_layout()
            plan = self.epilogue_plan([template_node, *epilogue_nodes])
            if plan is None:
                raise NotImplementedError("the fused epilogue no longer translates")
        # never written: removed before mark_run, whose allocations skip removed buffers
        V.graph.removed_buffers |= OrderedSet([*plan.fused_names, *fused_prologue])
        kernel, rendered = render_kernel(buffer, plan)
        for node in (*prologue_nodes, template_node, *epilogue_nodes):
            node.mark_run()
        nodes = kernel.arg_nodes()
        wrapper = V.graph.wrapper_code
        scratch = workspace_arg(kernel.workspace, buffer.get_device())
        schedule = [*prologue_nodes, template_node, *epilogue_nodes]
        with V.set_kernel_handler(kernel):
            if V.graph.cpp_wrapper:
                kernel_name = cpp_launch.define_kernel(rendered, schedule)
            else:
                kernel_name = self.define_kernel(rendered, schedule)
            if scratch is not None:
                wrapper.generate_workspace_allocation(scratch)
            references = kernel.call_references(None if scratch is None else scratch.get_name())
            if V.graph.cpp_wrapper:
                cpp_launch.generate_call(kernel_name, nodes, references, rendered.specs,
                                         buffer.get_device())
            else:
                wrapper.generate_kernel_call(kernel_name, references, triton=True,
                                             arg_types=[_arg_type(n) for n in nodes])
            if scratch is not None:
                wrapper.generate_workspace_deallocation(scratch)
        self.free_buffers_in_scheduler()

    def define_kernel(self, rendered: KernelSource, node_schedule: list[Any]) -> str:
        wrapper = V.graph.wrapper_code
        # One definition per source: the source holds the kernel's name, which hashes the
        # argument specs too (``name_kernel``), so a call site that finds its source here
        # meets the specs of the binary it reuses.
        kernel_name, source = rendered.name, rendered.source
        if source in wrapper.src_to_kernel:
            return wrapper.src_to_kernel[source]
        wrapper.src_to_kernel[source] = kernel_name
        wrapper.add_import_once("from cutedsl_inductor.runtime.loader import load_kernel")
        wrapper.add_import_once(
            "from cutedsl_inductor.compile.specs import ScalarSpec, Sym, TensorSpec"
        )
        _, path = write_source(source)
        body = kernel_definition(rendered)
        origins, detailed = get_kernel_metadata(node_schedule, wrapper)
        metadata = f"# kernel path: {path}\n{origins}\n{detailed}"
        wrapper.define_kernel(kernel_name, body, metadata)
        return kernel_name


def workspace_arg(workspace: Workspace | None, device: Any) -> Any:
    """Inductor's record of a choice's workspace: the output code allocates it (zeroed
    where asked) right before the call and frees it right after."""
    if workspace is None:
        return None
    mode = (WorkspaceZeroMode.ZERO_ON_CALL if workspace.zeroed
            else WorkspaceZeroMode.UNINITIALIZED)
    return WorkspaceArg(count=workspace.numel, zero_mode=mode, device=device,
                        outer_name=WorkspaceArg.unique_name(),
                        dtype=getattr(torch, workspace.dtype))


def _arg_type(node: Any) -> Any:
    if isinstance(node, Workspace):
        return getattr(torch, node.dtype)
    return node.get_dtype() if hasattr(node, "get_dtype") else int


def render_kernel(buffer: CuteDSLTemplateBuffer, plan: EpiloguePlan,
                  prologue: Any = None) -> tuple[Any, KernelSource]:
    """(template kernel, the kernel it renders) of ``buffer``'s template with ``plan``
    and its fused prologue (``prologue``, by default the buffer's own)."""
    prologue = buffer.prologue if prologue is None else prologue
    kernel, render = buffer.make_kernel_render(buffer, epilogue=plan, prologue=prologue)
    rendered = render()
    specs = specs_for_nodes(kernel.arg_nodes(), buffer.template.symbolic_shapes)
    kernel_name, source = name_kernel(buffer.template.name, rendered, specs)
    return kernel, KernelSource.of(kernel_name, source, specs, buffer.template.name,
                                   buffer.params)


def kernel_definition(kernel: KernelSource) -> str:
    """The expression that defines ``kernel`` in the output code: ``load_kernel`` of its
    parts as Python literals (the text the record replaced, unchanged). The source is
    embedded byte for byte (its compile key must equal the one the autotuner compiled);
    sources that a raw ''' string cannot hold were rejected when the choice was made."""
    return (
        f"load_kernel(\n    {kernel.name!r},\n    r'''{kernel.source}''',\n"
        f"    specs={list(kernel.specs)!r},\n    template={kernel.template!r},\n"
        f"    params={dict(kernel.params)!r},\n    inductor=True,\n)"
    )


def _from_template(nodes: list[Any]) -> list[Any]:
    """``nodes`` from the first of our templates on (past its fused prologue), or []."""
    index = next((i for i, n in enumerate(nodes) if is_cutedsl_template(n)), None)
    return [] if index is None else nodes[index:]
