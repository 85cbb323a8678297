"""``CuteDSLCombinedScheduling``: Inductor's CUDA combined scheduling with our template
nodes routed to ``CuteDSLScheduling`` (``scheduling.py``) and every other node left to
Inductor. ``install.py`` registers ``cuda_scheduling`` for "cuda"; it imports this module
at the first CUDA graph Inductor schedules, never at the package's import.

A module of its own because of what it imports: torch 2.14's and 2.15's
``torch._inductor.codegen.cuda_combined_scheduling`` imports its NVGEMM backend, which
imports CuTe DSL (``cutlass``, about 0.7 s) where it is installed, to register a pickler.
A warm process that only loads cached kernels never schedules a graph, so it never
imports it (``tests/runtime/test_warm_load.py``).
"""

from __future__ import annotations

from typing import Any

from torch._inductor.codegen.cuda_combined_scheduling import CUDACombinedScheduling

from .scheduling import CuteDSLScheduling, is_cutedsl_template


class CuteDSLCombinedScheduling(CUDACombinedScheduling):
    def __init__(self, scheduler: Any) -> None:
        super().__init__(scheduler)
        self._cutedsl = CuteDSLScheduling(scheduler)

    def can_fuse_vertical(self, node1: Any, node2: Any) -> bool:
        if _involves_cutedsl(node1, node2):
            return self._cutedsl.can_fuse_vertical(node1, node2)
        return super().can_fuse_vertical(node1, node2)

    def can_fuse_horizontal(self, node1: Any, node2: Any) -> bool:
        if _involves_cutedsl(node1, node2):
            return self._cutedsl.can_fuse_horizontal(node1, node2)
        return super().can_fuse_horizontal(node1, node2)

    def codegen_template(self, template_node: Any, epilogue_nodes: Any, prologue_nodes: Any,
                         *args: Any, **kwargs: Any) -> Any:
        if is_cutedsl_template(template_node):
            return self._cutedsl.codegen_template(template_node, epilogue_nodes, prologue_nodes)
        return super().codegen_template(template_node, epilogue_nodes, prologue_nodes,
                                        *args, **kwargs)


def _involves_cutedsl(*nodes: Any) -> bool:
    """Whether a (possibly fused) scheduler node contains one of our templates."""
    return any(is_cutedsl_template(n) for node in nodes for n in node.get_nodes())
