"""Finalize max-autotune's deferred choices that our kernels win, before fusion.

Under max-autotune Inductor lowers a GEMM with several choices to a
``MultiTemplateBuffer``: the choice is made only while scheduling. Its fusion pass
benchmarks epilogue fusion for Triton choices alone and finalizes any other winner
after fusion, so a consumer of a CuteDSL winner would always stay a separate kernel.
``PreFusionPass`` (Inductor's ``_pre_fusion_custom_pass``, installed by ``install()``)
runs just before fusion: with ``config.epilogue_fusion`` on, every MultiTemplateBuffer
that offers our choices is benchmarked (what Inductor would do later anyway) and our
fastest choice is taken -- replaced by its ``CuteDSLTemplateBuffer`` exactly as Inductor
finalizes an extern winner -- when it is the fastest overall, or, if the node has a
pointwise consumer, when it is slower by less than fusing would save: the round trip of
the output through memory plus a launch (``fusion_saving_ms``). Our scheduling can then
fuse the epilogue.

Invariants: a node that our choice does not win, or that fails to benchmark, is left
untouched for Inductor's own flow; a pass that was set before ours still runs, after it.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from torch._inductor import ir
from torch._inductor.scheduler import SchedulerNode
from torch._inductor.virtualized import V

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
            timings = multi.choice_timings()
        except Exception as err:  # Inductor's own finalization will see it again
            log.debug("not finalizing %s early: %s", multi.get_name(), err)
            continue
        winner = chosen_cutedsl_choice(timings, fusion_saving_ms(node))
        if winner is None:
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


def chosen_cutedsl_choice(timings: dict[Any, float], saving_ms: float) -> Any:
    """Our fastest choice if it is within ``saving_ms`` of the fastest of all, else None."""
    ours = [c for c in timings if isinstance(c, CuteDSLTemplateCaller)]
    if not ours:
        return None
    best_ours = min(ours, key=timings.__getitem__)
    return best_ours if timings[best_ours] <= min(timings.values()) + saving_ms else None


# What fusing a pointwise consumer saves: the output written and read back at this
# fraction of the H200's HBM bandwidth, and one kernel launch as seen inside a CUDA graph.
_BYTES_PER_MS = 3.5e9
_LAUNCH_MS = 0.002


def fusion_saving_ms(node: Any) -> float:
    """0 unless a pointwise node consumes ``node``'s output."""
    consumers = [user.node for output in node.get_outputs() for user in output.users]
    if not any(isinstance(c, SchedulerNode) and not (c.is_template() or c.is_reduction())
               for c in consumers):
        return 0.0
    buffer = node.node
    numel = V.graph.sizevars.optimization_hint(buffer.get_numel(), fallback=0)
    return 2 * numel * buffer.get_dtype().itemsize / _BYTES_PER_MS + _LAUNCH_MS


def install_pre_fusion_pass() -> None:
    from torch._inductor import config as inductor_config

    current = inductor_config._pre_fusion_custom_pass
    if not isinstance(current, PreFusionPass):
        inductor_config._pre_fusion_custom_pass = PreFusionPass(current)
