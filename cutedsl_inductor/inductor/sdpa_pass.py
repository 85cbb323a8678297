"""The joint-graph rewrite that makes ``scaled_dot_product_attention`` a choice set.

AOT autograd decomposes SDPA at trace time into the op pair of the backend that SDPA's
fixed priority picks (``_scaled_dot_product_{flash,efficient,cudnn}_attention`` and its
``_backward``), which Inductor lowers as ATen fallbacks. ``rewrite_sdpa`` replaces each
pair with ``cutedsl::sdpa`` / ``cutedsl::sdpa_backward`` (``sdpa_ops.py``: the logsumexp
passed between them in one canonical form), whose lowerings (``sdpa.py``) autotune the
forward and the backward each over every eligible ATen backend and our FlexAttention
kernels. A forward with no backward (an inference graph) is rewritten alone.

Where: ``SDPAChoicePass`` joins Inductor's joint-graph pattern passes
(``fx_passes.joint_graph.pass_patterns``, run for training and inference graphs alike,
under ``torch._inductor.config.pattern_matcher``), not ``joint_custom_pre_pass``, whose
``uuid`` would enter the FX graph cache key of every graph: a graph it rewrites carries
our ops (the key sees them), one it does not keeps its key (``config.sdpa`` is in our
part of every key, like every code-changing knob). It rewrites only with ``config.sdpa``
on and CUTEDSL among the GEMM backends (a graph that lists no CUTEDSL is Inductor's
alone), under max-autotune (the choice set costs a timing of every choice, which
max-autotune asks for), for a target of sm_90 and ops on CUDA tensors.

Rewritten: 4-D inputs, dropout 0, no debug mask, no bias or a bias broadcast over heads
(size or stride 0 in dim 1) that needs no gradient, the backward (if any) reading the
forward's own outputs and inputs. Anything else is left to SDPA's backend, with the
reason logged (``cutedsl_inductor.inductor.sdpa_pass`` at INFO).

Eligible backends are decided here, on the traced inputs (fake tensors), by torch's own
``torch.backends.cuda.can_use_*_attention`` -- the checks SDPA's dispatch ran to pick the
traced one, which is always kept, first. A check that fails to run counts as ineligible.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import operator
from typing import Any

import torch

from ..compile.compiler import target_arch
from . import sdpa_ops  # noqa: F401  (registers torch.ops.cutedsl.sdpa*)
from .cache_key import sdpa_choice_enabled
from .fx_nodes import bound

log = logging.getLogger(__name__)

aten = torch.ops.aten
FORWARD = {
    aten._scaled_dot_product_flash_attention.default: "flash",
    aten._scaled_dot_product_efficient_attention.default: "efficient",
    aten._scaled_dot_product_cudnn_attention.default: "cudnn",
}
BACKWARD = {
    "flash": aten._scaled_dot_product_flash_attention_backward.default,
    "efficient": aten._scaled_dot_product_efficient_attention_backward.default,
    "cudnn": aten._scaled_dot_product_cudnn_attention_backward.default,
}
_PROBES = {"flash": "can_use_flash_attention", "efficient": "can_use_efficient_attention",
           "cudnn": "can_use_cudnn_attention"}


@dataclasses.dataclass(frozen=True)
class Pair:
    """One traced SDPA: its forward node, its backward node (None in inference) and the
    arguments of ``cutedsl::sdpa``."""

    forward: torch.fx.Node
    backward: torch.fx.Node | None
    q: torch.fx.Node
    k: torch.fx.Node
    v: torch.fx.Node
    bias: torch.fx.Node | None
    is_causal: bool
    scale: float
    backends: str


def _outputs(node: torch.fx.Node) -> dict[int, list[torch.fx.Node]] | None:
    """The node's getitem users by index; None where another kind of user reads it."""
    found: dict[int, list[torch.fx.Node]] = {}
    for user in node.users:
        if user.target is not operator.getitem:
            return None
        found.setdefault(user.args[1], []).append(user)
    return found


def eligible_backends(traced: str, q: Any, k: Any, v: Any, bias: Any, is_causal: bool) -> str:
    """The ATen backends that torch's checks admit for these (fake) inputs, ``traced``
    first, comma-separated."""
    from torch.backends import cuda

    names = [traced]
    gqa = q.shape[1] != k.shape[1]
    for name in ("cudnn", "flash", "efficient"):
        if name == traced:
            continue
        try:
            params = cuda.SDPAParams(q, k, v, None if name == "flash" else bias, 0.0,
                                     is_causal, gqa)
            if name == "flash" and bias is not None:
                continue  # flash takes no mask
            if getattr(cuda, _PROBES[name])(params, False):
                names.append(name)
        except Exception as err:  # an ineligible backend, never a failed compile
            log.debug("SDPA: torch's %s check failed to run (%s): not offered", name, err)
    return ",".join(names)


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def match(forward: torch.fx.Node) -> Pair | str:
    """The pair rooted at ``forward`` (a backend's forward node), or why it is left."""
    backend = FORWARD[forward.target]
    args = bound(forward)
    q, k, v, bias = args["query"], args["key"], args["value"], args.get("attn_bias")
    vals = [_val(n) for n in (q, k, v)]
    if any(x is None for x in vals):
        return "the inputs carry no traced values"
    if any(x.device.type != "cuda" for x in vals):
        return f"inputs on {vals[0].device.type}, not CUDA"
    if any(x.dim() != 4 for x in vals):
        return "inputs are not 4-D"
    if args["dropout_p"] != 0.0:
        return f"dropout {args['dropout_p']} (the choice set takes dropout 0)"
    if args.get("return_debug_mask"):
        return "a debug mask is asked for"
    if bias is not None:
        b = _val(bias)
        if b is None or b.dim() != 4 or not (b.shape[1] == 1 or b.stride(1) == 0):
            return "the mask is not broadcast over heads"
    outputs = _outputs(forward)
    if outputs is None:
        return "the forward's outputs are read other than by index"
    readers = {u for i, nodes in outputs.items() if i != 0 for n in nodes for u in n.users}
    backward = None
    if readers:
        if len(readers) != 1 or next(iter(readers)).target != BACKWARD[backend]:
            return "the forward's saved outputs are read by something but its backward"
        backward = next(iter(readers))
        reason = _check_backward(backward, args, outputs)
        if reason is not None:
            return reason
    scale = args["scale"]
    if scale is None:
        scale = 1.0 / math.sqrt(vals[0].shape[-1])
    backends = eligible_backends(backend, *vals, _val(bias), bool(args["is_causal"]))
    return Pair(forward, backward, q, k, v, bias, bool(args["is_causal"]), float(scale),
                backends)


def _check_backward(node: torch.fx.Node, fwd: dict[str, Any],
                    outputs: dict[int, list[torch.fx.Node]]) -> str | None:
    args = bound(node)
    same = all(args[name] is fwd[name] for name in ("query", "key", "value"))
    if not same or args.get("attn_bias") is not fwd.get("attn_bias"):
        return "the backward reads other inputs than its forward"
    if args["out"] not in outputs.get(0, []) or args["logsumexp"] not in outputs.get(1, []):
        return "the backward reads another out or logsumexp than its forward's"
    if args["dropout_p"] != 0.0 or args["is_causal"] != fwd["is_causal"]:
        return "the backward's dropout or causality differs from its forward's"
    if args["scale"] != fwd["scale"]:
        return "the backward's scale differs from its forward's"
    grads = _outputs(node)
    if grads is None or any(i > 2 and nodes and any(n.users for n in nodes)
                            for i, nodes in grads.items()):
        return "the mask needs a gradient"
    return None


def _call(graph: torch.fx.Graph, target: Any, args: tuple, mode: Any) -> torch.fx.Node:
    node = graph.call_function(target, args)
    with mode:
        node.meta["val"] = target(*(a.meta["val"] if isinstance(a, torch.fx.Node) else a
                                    for a in args))
    return node


def _getitems(graph: torch.fx.Graph, node: torch.fx.Node, count: int) -> list[torch.fx.Node]:
    items = []
    for i in range(count):
        item = graph.call_function(operator.getitem, (node, i))
        item.meta["val"] = node.meta["val"][i]
        items.append(item)
    return items


def rewrite(graph: torch.fx.Graph, pair: Pair) -> None:
    """Replace ``pair``'s nodes with ``cutedsl::sdpa`` (and ``cutedsl::sdpa_backward``)."""
    from torch._guards import detect_fake_mode

    mode = detect_fake_mode([pair.q.meta["val"]])
    fwd_outputs = _outputs(pair.forward) or {}
    with graph.inserting_before(pair.forward):
        new = _call(graph, torch.ops.cutedsl.sdpa.default,
                    (pair.q, pair.k, pair.v, pair.bias, pair.is_causal, pair.scale,
                     pair.backends), mode)
        out, lse = _getitems(graph, new, 2)
    for item in fwd_outputs.get(0, []):
        item.replace_all_uses_with(out)
    doomed = [pair.forward, *(n for nodes in fwd_outputs.values() for n in nodes)]
    if pair.backward is not None:
        grad_out = bound(pair.backward)["grad_out" if "grad_out" in
                                        bound(pair.backward) else "grad_out_"]
        with graph.inserting_before(pair.backward):
            new_bwd = _call(graph, torch.ops.cutedsl.sdpa_backward.default,
                            (grad_out, pair.q, pair.k, pair.v, out, lse, pair.bias,
                             pair.is_causal, pair.scale, pair.backends), mode)
            grads = _getitems(graph, new_bwd, 3)
        for i, nodes in (_outputs(pair.backward) or {}).items():
            for item in nodes:
                if i < 3:
                    item.replace_all_uses_with(grads[i])
                doomed.append(item)
        doomed.append(pair.backward)
    doomed += [out, lse]
    while any(not node.users for node in doomed):  # users first
        for node in [n for n in doomed if not n.users]:
            graph.erase_node(node)
            doomed.remove(node)


def rewrite_sdpa(graph: torch.fx.Graph) -> int:
    """Rewrite every suitable SDPA op pair in ``graph``; returns how many."""
    count = 0
    for node in [n for n in graph.nodes if n.op == "call_function" and n.target in FORWARD]:
        found = match(node)
        if isinstance(found, str):
            log.info("SDPA %s left to SDPA's backend: %s", node.name, found)
            continue
        rewrite(graph, found)
        log.debug("SDPA %s rewritten (eligible ATen backends: %s)", node.name,
                  found.backends)
        count += 1
    return count


def sdpa_pass_applies() -> bool:
    """The knob is on, CUTEDSL listed, under max-autotune, for an sm_90 target."""
    return sdpa_choice_enabled() and target_arch().startswith("sm_90")


class SDPAChoicePass:
    """A joint-graph pass in ``pass_patterns``' protocol: ``apply(graph)`` -> count."""

    def apply(self, graph: torch.fx.Graph) -> int:
        return rewrite_sdpa(graph) if sdpa_pass_applies() else 0


def install_sdpa_pass() -> None:
    """Append ``SDPAChoicePass`` to Inductor's joint-graph passes (idempotent)."""
    from torch._inductor.fx_passes import joint_graph

    if not any(isinstance(p, SDPAChoicePass) for p in joint_graph.pass_patterns):
        joint_graph.pass_patterns.append(SDPAChoicePass())
