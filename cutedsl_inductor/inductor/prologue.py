"""Prologue fusion into our templates, decided in our pre-fusion step and timed.

Inductor's own prologue fusion serves Triton templates: torch 2.11 refuses any other
template, and 2.13 asks a template for its ``allowed_prologue_inps`` (ours has none) and
first applies a byte heuristic that refuses the cases that matter here -- an fp32 -> bf16
cast reads more bytes than it writes, and a multiply by RMSNorm's weight cannot be
computed in bf16. So ``fuse_prologues`` (run by ``multi_template.PreFusionPass`` just
before Inductor's fusion pass, once our deferred choices are settled) does it for our
templates, the same on every supported torch: for each template node of ours, a
producer of one of its inputs that is a pointwise scheduler node with no other user
(and whose fusion makes no cycle) is planned (``CuteDSLScheduling.prologue_plan``: it
translates, the choice claims that input with ``def_prologue`` and the fused kernel
compiles) and, on a GPU, timed: the fused kernel against the template's kernel after a
copy of the source into the input's dtype and layout (the memory traffic of the
producer's own kernel, which is what fusing saves), in interleaved rounds
(``autotune/retime.py``: a repeat of the same kernels at the same sizes takes the
decision untimed, in this process and in later ones). Only a fused kernel that wins is
taken: the scheduling backend makes the two one node (``fuse``), whose template buffer
carries the plan (``buffer.prologue``); the epilogue can still fuse after it, and the
scheduling renders both. Without a GPU nothing can be timed, and a prologue that
compiles is fused (GPU-less compiles, precompiles and tests see the fused kernel).

Invariants: a template takes one prologue; a node whose producer is not taken is left
as it was. Failure semantics: anything that fails while planning, compiling or timing
leaves the nodes unfused (logged), never breaking the compile.
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
from torch.utils._ordered_set import OrderedSet

from .. import config
from ..autotune.retime import fastest_in_rounds
from ..compile.specs import Workspace
from ..runtime.loader import load
from ..template.epilogue import IDENTITY
from .scheduling import (CuteDSLScheduling, fusion_estimate_ms, is_cutedsl_template,
                         render_kernel)

log = logging.getLogger(__name__)


def enabled() -> bool:
    """Ours on (``config.prologue_fusion``) and Inductor's not switched off."""
    return config.prologue_fusion and inductor_config.prologue_fusion


def fuse_prologues(nodes: list[Any]) -> list[Any]:
    """``nodes`` with each producer that wins fused into our template node it feeds."""
    for template in [n for n in nodes if is_cutedsl_template(n)]:
        scheduling = CuteDSLScheduling(template.scheduler)
        for producer in producers(template):
            plan = scheduling.prologue_plan(producer, template)
            if plan is None or not _wins(template, plan):
                continue
            template.node.prologue = plan
            node = fuse(producer, template)
            nodes = [node if n is template else n for n in nodes if n is not producer]
            log.debug("%s: fused %s as its prologue", template.get_name(), producer.get_name())
            break
    return nodes


def fuse(producer: Any, template: Any) -> Any:
    """The two as one scheduler node, as ``Scheduler.fuse_two_nodes`` makes it (whose
    stream bookkeeping torch 2.13 sets up only after this pass)."""
    scheduler = template.scheduler
    node = scheduler.get_backend(template.get_device()).fuse(producer, template)
    scheduler.name_to_fused_node.update({n.get_name(): node for n in node.get_nodes()})
    return node


def producers(template: Any) -> list[Any]:
    """The scheduler nodes that write an input of ``template`` and nothing else: one
    output, read by ``template`` alone, whose fusion with it makes no cycle."""
    scheduler = template.scheduler
    found = []
    for name in OrderedSet(dep.name for dep in template.read_writes.reads):
        buf = scheduler.name_to_buf.get(name)
        node = buf.defining_op if buf is not None else None
        if not isinstance(node, SchedulerNode) or node in found or node is template:
            continue
        outputs = node.get_outputs()
        if len(outputs) == 1 and [u.node for u in outputs[0].users] == [template] and \
                not scheduler.will_fusion_create_cycle(node, template):
            found.append(node)
    return found


def prologue_saving_ms(node: Any) -> float:
    """What fusing a producer of ``node``'s inputs would save (0 where none is a
    candidate): its reads and writes through memory and its launch."""
    candidates = [p for p in producers(node) if not (p.is_reduction() or p.is_template())]
    if not candidates:
        return 0.0
    nbytes = max(p.get_read_buffer_sizes() + p.get_write_buffer_sizes() for p in candidates)
    return fusion_estimate_ms(nbytes)


def _wins(template: Any, plan: Any) -> bool:
    """Whether the fused kernel beats the template's kernel after the producer's traffic
    (see the module docstring); True without a GPU. A failure to time it is a no."""
    if not torch.cuda.is_available():
        return True
    buffer = template.node
    try:
        tensors: dict[str, torch.Tensor] = {}
        fused_name, fused = kernel_call(buffer, plan, tensors)
        plain_name, plain = kernel_call(buffer, None, tensors)
        source, target = tensors[plan.source], tensors[plan.target]

        def unfused() -> None:
            target.copy_(source)
            plain()

        unfused_name = f"{plain_name}+copy:{plan.source}"
        best, medians = fastest_in_rounds({fused_name: fused, unfused_name: unfused},
                                          tuple(sorted(f"{n}{tuple(t.shape)}{t.dtype}"
                                                       for n, t in tensors.items())))
    except Exception as err:  # unfused, never a crash
        log.warning("%s: not fusing its prologue, which failed to run: %s",
                    template.get_name(), err)
        return False
    log.debug("%s with its prologue: %s; %s", template.get_name(),
              {k: round(ms, 4) for k, ms in medians.items()} or "as decided before",
              "fused" if best == fused_name else "unfused")
    return best == fused_name


def kernel_call(buffer: Any, prologue: Any,
                tensors: dict[str, torch.Tensor]) -> tuple[str, Callable[[], Any]]:
    """The name of ``buffer``'s kernel with ``prologue`` (None: without one) and a call of
    it on random example tensors of its arguments (size hints; one per buffer name, from
    or into ``tensors``), run once here so that a failing kernel raises now."""
    from torch._dynamo.testing import rand_strided

    saved, buffer.prologue = buffer.prologue, prologue
    try:
        kernel, rendered = render_kernel(buffer, IDENTITY)
    finally:
        buffer.prologue = saved
    runner, name = load(rendered), rendered.name
    hints = V.graph.sizevars.optimization_hints
    args = []
    for n in kernel.arg_nodes():
        if isinstance(n, Workspace):
            args.append(n.make(buffer.get_device()))
            continue
        if not isinstance(n, ir.IRNode):
            args.append(V.graph.sizevars.optimization_hint(n))
            continue
        if n.get_name() not in tensors:
            tensors[n.get_name()] = rand_strided(hints(n.get_size()), hints(n.get_stride()),
                                                 dtype=n.get_dtype(), device=n.get_device())
        args.append(tensors[n.get_name()])
    runner.run(*args)
    return name, functools.partial(runner.run, *args)
