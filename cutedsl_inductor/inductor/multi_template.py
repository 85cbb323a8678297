"""Finalize max-autotune's deferred choices that our kernels win, before fusion.

Under max-autotune Inductor lowers a GEMM with several choices to a
``MultiTemplateBuffer``: the choice is made only while scheduling. Its fusion pass
benchmarks epilogue fusion for Triton choices alone and finalizes any other winner
after fusion, so a consumer of a CuteDSL winner would always stay a separate kernel.
``PreFusionPass`` (Inductor's ``_pre_fusion_custom_pass``, installed by ``install()``)
runs just before fusion: with ``config.epilogue_fusion`` on, every MultiTemplateBuffer
that offers our choices is benchmarked (what Inductor would do later anyway) and, if a
CuteDSL choice is fastest, replaced by that choice's ``CuteDSLTemplateBuffer`` exactly
as Inductor finalizes an extern winner. Our scheduling can then fuse its epilogue.

Invariants: a node that our choice does not win, or that fails to benchmark, is left
untouched for Inductor's own flow; a pass that was set before ours still runs, after it.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from torch._inductor import ir
from torch._inductor.scheduler import SchedulerNode

from .. import config
from ..template.caller import CuteDSLTemplateCaller

log = logging.getLogger(__name__)

NodePass = Callable[[list[Any]], list[Any]]


class PreFusionPass:
    """Our pre-fusion step, chained before the pass that was installed earlier."""

    def __init__(self, previous: NodePass | None) -> None:
        self.previous = previous

    def __call__(self, nodes: list[Any]) -> list[Any]:
        if config.epilogue_fusion:
            finalize_cutedsl_winners(nodes)
        return self.previous(nodes) if self.previous is not None else nodes


def finalize_cutedsl_winners(nodes: list[Any]) -> None:
    """Replace, in place, each MultiTemplateBuffer node won by a CuteDSL choice."""
    for index, node in enumerate(nodes):
        if not (isinstance(node, SchedulerNode) and isinstance(node.node, ir.MultiTemplateBuffer)):
            continue
        multi = node.node
        if not any(isinstance(choice, CuteDSLTemplateCaller) for choice in multi.choices):
            continue
        try:
            winner, _ = multi.get_min_choice()
        except Exception as err:  # Inductor's own finalization will see it again
            log.debug("not finalizing %s early: %s", multi.get_name(), err)
            continue
        if not isinstance(winner, CuteDSLTemplateCaller):
            continue
        with ir.IRNode.current_origins(multi.origins):
            output = winner.output_node()
        if multi.origin_node is not None:
            ir.assign_origin_node(output, multi.origin_node)
        buffer = output.data.data
        buffer.layout = multi.layout
        scheduler = node.scheduler
        scheduler._replace_node(buffer, multi, index, node)  # what Inductor's finalize does
        nodes[index] = scheduler.name_to_node[node.get_name()]
        log.debug("%s: CuteDSL choice %s finalized before fusion", multi.get_name(),
                  winner.description)


def install_pre_fusion_pass() -> None:
    from torch._inductor import config as inductor_config

    current = inductor_config._pre_fusion_custom_pass
    if not isinstance(current, PreFusionPass):
        inductor_config._pre_fusion_custom_pass = PreFusionPass(current)
