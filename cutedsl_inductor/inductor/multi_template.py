"""Finalize max-autotune's deferred choices that our kernels win, before fusion.

Under max-autotune Inductor lowers a GEMM with several choices to a
``MultiTemplateBuffer``: the choice is made only while scheduling. Its fusion pass
benchmarks epilogue fusion for Triton choices alone and finalizes any other winner
after fusion, so a consumer of a CuteDSL winner would always stay a separate kernel.
``PreFusionPass`` (Inductor's ``_pre_fusion_custom_pass``, installed by ``install()``)
runs just before fusion: with ``config.epilogue_fusion`` (or ``config.prologue_fusion``)
on, every MultiTemplateBuffer that offers our choices is benchmarked (what Inductor would
do later anyway) and our fastest choice is taken -- replaced by its
``CuteDSLTemplateBuffer`` exactly as Inductor finalizes an extern winner -- when it is
the fastest overall, or, if the node has a pointwise consumer (a pointwise producer of
an input), when it is slower by less than fusing would save: the round trip of the
output through memory plus a launch (``fusion_saving_ms``; the producer's traffic and
launch, ``prologue.prologue_saving_ms``). Our scheduling can then fuse the epilogue;
the pass then fuses the prologues that win their timing (``prologue.py``).

The autotuner timed each choice alone, but a fused epilogue costs configs differently
(a ping-pong kernel hides it behind the other warpgroup's mainloop, a cooperative one
does not). So where a single pointwise consumer will fuse, our
``config.fused_choice_candidates`` fastest choices (the fastest ping-pong one among them,
``retime_candidates``) are compiled with that epilogue and
timed on example inputs (on the GPU; the swap is that of the buffer's kernel render and
parameters, which are all that differ between our choices of one node), in interleaved
rounds (``autotune.timing.interleaved_ms``: the clock drifting under the power cap reaches
every candidate alike; fused kernels of one node often differ by 1-2%, as much as one
timing moves), and the fastest fused kernel (median round) is kept
(``autotune/retime.py``; a repeat of the same fused kernels at the same sizes -- a
model's next layer, a later process, another machine of the fleet -- takes the first
one's winner untimed: it is kept as a tuning decision, locally and remotely).

What this pass times otherwise is Inductor's own autotuning of the node
(``multi.choice_timings()``), which Inductor runs at its own finalization anyway and keeps
in its autotune cache (``PersistentCache``, by each choice's ``hash_key``, ours naming its
binary): on a warm machine it returns those timings without precompiling or timing
anything, so the settle's decision, a function of them, needs no store of ours.

Under Inductor's distributed autotuning with our choices taking part (``distributed.py``)
this step runs inside torch's distributed one (``distributed_schedule``, installed over
it), which comes right after the pre-fusion pass: ours first, so that what this rank
sends for a node it autotuned is the choice that node ends with, then torch's exchange,
then our prologues, which the rebuilt nodes can take too. A pass set before ours then
runs before our step.

Invariants: a node that our choice does not win, or that fails to benchmark, is left
untouched for Inductor's own flow; a pass that was set before ours still runs, after it.
The pass is a custom pass of Inductor's kind (``uuid``: ``cache_key.fingerprint``), so
the FX graph cache keeps working with it installed; a plain callable set before ours, which Inductor cannot key,
is left alone and ours not installed (a warning says so).
A candidate whose fused kernel fails to compile or run is skipped (logged); if none is
timed, our plain-time winner stays.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable

import torch
from torch._inductor import config as inductor_config
from torch._inductor import ir
from torch._inductor.scheduler import SchedulerNode
from torch._inductor.virtualized import V

from .. import config
from ..autotune.retime import fastest_in_rounds
from ..compile.specs import Workspace
from ..runtime.loader import load
from ..template.caller import CuteDSLTemplateCaller
from . import distributed, prologue
from .cache_key import fingerprint
from .scheduling import CuteDSLScheduling, fusion_estimate_ms, render_kernel

try:  # torch 2.13 keys a scheduler pass of this kind into the FX graph cache
    from torch._inductor.custom_graph_pass import CustomSchedulerPass as SchedulerPass
except ImportError:  # torch 2.11 and 2.12 key it as a graph pass
    from torch._inductor.custom_graph_pass import CustomGraphPass as SchedulerPass

log = logging.getLogger(__name__)


class PreFusionPass(SchedulerPass):
    """Our pre-fusion step, chained before the pass that was installed earlier."""

    def __init__(self, previous: SchedulerPass | None) -> None:
        self.previous = previous

    def __call__(self, nodes: list[Any]) -> list[Any]:
        if not distributed.take_part():  # else inside that step: distributed_schedule
            finalize_step(nodes)
            if prologue.enabled():
                nodes = prologue.fuse_prologues(nodes)
        return self.previous(nodes) if self.previous is not None else nodes

    def uuid(self) -> Any:
        previous = self.previous.uuid() if self.previous is not None else None
        return fingerprint("PreFusionPass", previous)


def finalize_step(nodes: list[Any]) -> dict[str, CuteDSLTemplateCaller]:
    """``finalize_cutedsl_winners`` where a fusion of ours is on, else nothing."""
    if config.epilogue_fusion or prologue.enabled():
        return finalize_cutedsl_winners(nodes)
    return {}


def distributed_schedule(scheduler: Any) -> None:
    """Inductor's distributed-autotuning step (installed over torch's), with our
    pre-fusion step first where our choices take part (``distributed.py``): the
    winners this rank finalizes are what it sends; the placeholders rebuilt from the
    other ranks' winners can then take a prologue like the rest."""
    if not distributed.take_part():
        assert _torch_step is not None  # installed only after it is kept
        _torch_step(scheduler)
        return
    finalized = finalize_step(scheduler.nodes)
    distributed.exchange(scheduler, distributed.local_results(scheduler.nodes, finalized))
    if prologue.enabled():
        scheduler.nodes = prologue.fuse_prologues(scheduler.nodes)


# torch's distributed_autotune.schedule, which distributed_schedule replaces (when installed)
_torch_step: Callable[[Any], None] | None = None


def install_distributed_schedule() -> None:
    """Put ``distributed_schedule`` in place of torch's step, which it keeps (no-op on a
    torch whose step it does not know, or where it is in place)."""
    global _torch_step
    module = distributed.torch_distributed
    if not distributed.supported() or module.schedule is distributed_schedule:
        return
    _torch_step = module.schedule
    module.schedule = distributed_schedule


def finalize_cutedsl_winners(nodes: list[Any]) -> dict[str, CuteDSLTemplateCaller]:
    """Replace, in place, each MultiTemplateBuffer node won by a CuteDSL choice; returns
    their buffer names -> the choice each ends with."""
    finalized = {}
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
        epilogue_ms = fusion_saving_ms(node) if config.epilogue_fusion else 0.0
        prologue_ms = prologue.prologue_saving_ms(node) if prologue.enabled() else 0.0
        winner = chosen_cutedsl_choice(timings, epilogue_ms + prologue_ms)
        if winner is None:
            continue
        with ir.IRNode.current_origins(multi.origins):
            output = winner.output_node()
        if multi.origin_node is not None:
            ir.assign_origin_node(output, multi.origin_node)
        buffer = output.data.data
        buffer.layout = multi.layout
        scheduler = node.scheduler
        if not hasattr(scheduler, "node_to_mempool"):  # torch 2.14 sets them after this pass
            scheduler.node_to_mempool, scheduler.buff_to_mempool = {}, {}
        scheduler._replace_node(buffer, multi, index, node)  # what Inductor's finalize does
        nodes[index] = scheduler.name_to_node[node.get_name()]
        log.debug("%s: CuteDSL choice %s finalized before fusion", multi.get_name(),
                  winner.description)
        if epilogue_ms > 0:
            try:
                retime_with_epilogue(nodes[index], timings)
            except Exception as err:  # keep the plain-time winner, never a crash
                use_choice(nodes[index].node, winner)
                log.warning("%s: kept %s, not retimed with its epilogue: %s",
                            multi.get_name(), winner.description, err)
        finalized[multi.get_name()] = chosen_of(nodes[index].node, timings)
    return finalized


def chosen_of(buffer: Any, choices: Any) -> CuteDSLTemplateCaller:
    """The choice among ``choices`` that our template ``buffer`` now renders."""
    return next(c for c in choices if isinstance(c, CuteDSLTemplateCaller)
                and c.make_kernel_render is buffer.make_kernel_render)


def chosen_cutedsl_choice(timings: dict[Any, float], saving_ms: float) -> Any:
    """Our fastest choice if it is within ``saving_ms`` of the fastest of all, else None."""
    ours = [c for c in timings if isinstance(c, CuteDSLTemplateCaller)]
    if not ours:
        return None
    best_ours = min(ours, key=timings.__getitem__)
    return best_ours if timings[best_ours] <= min(timings.values()) + saving_ms else None


def retime_with_epilogue(node: SchedulerNode, timings: dict[Any, float]) -> None:
    """Keep, on ``node`` (our finalized template), the choice among our fastest whose
    kernel with its pointwise consumer fused runs fastest (see the module docstring)."""
    ours = sorted((c for c in timings if isinstance(c, CuteDSLTemplateCaller)),
                  key=timings.__getitem__)
    candidates = retime_candidates(ours, config.fused_choice_candidates)
    consumers = pointwise_consumers(node)
    if len(candidates) < 2 or len(consumers) != 1 or not torch.cuda.is_available():
        return
    scheduling = CuteDSLScheduling(node.scheduler)
    calls: dict[str, Callable[[], Any]] = {}  # by fused kernel name
    choice_of: dict[str, Any] = {}
    tensors: dict[tuple, torch.Tensor] = {}  # example inputs, shared by the candidates
    for choice in candidates:
        use_choice(node.node, choice)
        try:
            plan = scheduling.epilogue_plan([node, consumers[0]])  # compiles it, or None
            if plan is not None:
                name, call = fused_kernel_call(node.node, plan, tensors)
                calls[name], choice_of[name] = call, choice
        except Exception as err:  # this candidate is skipped, never a crash
            log.warning("not timing %s with its epilogue: %s", choice.description, err)
    if not calls:
        use_choice(node.node, candidates[0])
        return
    best, fused_ms = fastest_in_rounds(calls, tuple(sorted(map(str, tensors))))
    use_choice(node.node, choice_of[best])
    log.debug("%s with its epilogue: %s; kept %s", node.get_name(),
              {choice_of[k].description: round(ms, 4) for k, ms in fused_ms.items()}
              or "as the earlier retiming of these kernels", choice_of[best].description)


def retime_candidates(ours: list[Any], count: int) -> list[Any]:
    """The ``count`` of ``ours`` (fastest first) to time with the epilogue: the fastest,
    but with the fastest ping-pong choice among them where one is offered. A ping-pong
    kernel runs one warpgroup's epilogue under the other's mainloop, so fused it can
    overtake cooperative kernels that were faster plain (H200, 8192x4096x4096, fused
    relu(x @ w.T + b) * 0.5 + r over the plain GEMM: ping-pong 1.07x, cooperative
    1.11x; benchmarks/epilogue_cost.py), and the fastest plain choices are often all
    cooperative."""
    chosen = ours[:count]
    pingpong = [choice for choice in ours if choice.params.get("PINGPONG")]
    if count >= 2 and pingpong and pingpong[0] not in chosen:
        chosen = ours[:count - 1] + pingpong[:1]
    return chosen


def use_choice(buffer: Any, choice: CuteDSLTemplateCaller) -> None:
    """Point our template buffer at another of our choices for the same node."""
    buffer.make_kernel_render = choice.make_kernel_render
    buffer.params = choice.params


def fused_kernel_call(buffer: Any, plan: Any,
                      tensors: dict[tuple, torch.Tensor]) -> tuple[str, Callable[[], Any]]:
    """The name of ``buffer``'s kernel with ``plan`` fused, and a call of it on random
    example tensors shaped like its arguments (size hints; taken from, or added to,
    ``tensors`` by position, size, stride, dtype and device: candidates for one node share
    them, no two arguments of one call alias), run once here so that a failing kernel
    raises now."""
    from torch._dynamo.testing import rand_strided

    kernel, rendered = render_kernel(buffer, plan)
    runner, name = load(rendered), rendered.name
    hints = V.graph.sizevars.optimization_hints
    args = []
    for position, n in enumerate(kernel.arg_nodes()):
        if isinstance(n, Workspace):
            args.append(n.make(buffer.get_device()))
            continue
        if not isinstance(n, ir.IRNode):
            args.append(V.graph.sizevars.optimization_hint(n))
            continue
        key = (position, tuple(hints(n.get_size())), tuple(hints(n.get_stride())),
               n.get_dtype(), n.get_device())
        if key not in tensors:
            tensors[key] = rand_strided(*key[1:3], dtype=key[3], device=key[4])
        args.append(tensors[key])
    runner.run(*args)
    return name, functools.partial(runner.run, *args)


def pointwise_consumers(node: Any) -> list[Any]:
    """The pointwise scheduler nodes that read ``node``'s outputs."""
    consumers = {id(user.node): user.node for output in node.get_outputs()
                 for user in output.users}
    return [c for c in consumers.values()
            if isinstance(c, SchedulerNode) and not (c.is_template() or c.is_reduction())]


def fusion_saving_ms(node: Any) -> float:
    """0 unless a pointwise node consumes ``node``'s output."""
    if not pointwise_consumers(node):
        return 0.0
    buffer = node.node
    numel = V.graph.sizevars.optimization_hint(buffer.get_numel(), fallback=0)
    return fusion_estimate_ms(2 * numel * buffer.get_dtype().itemsize)  # written, read back


def install_pre_fusion_pass() -> None:
    current = inductor_config._pre_fusion_custom_pass
    if isinstance(current, PreFusionPass):
        return
    if current is not None and not isinstance(current, SchedulerPass):
        log.warning("torch._inductor.config._pre_fusion_custom_pass is a plain callable, "
                    "which the FX graph cache cannot key: CuteDSL's pre-fusion step is not "
                    "installed, so epilogues do not fuse into deferred max-autotune choices")
        return
    inductor_config._pre_fusion_custom_pass = PreFusionPass(current)
