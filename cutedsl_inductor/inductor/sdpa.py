"""Lowerings of ``cutedsl::sdpa`` and ``cutedsl::sdpa_backward``: each autotunes its
op over every eligible ATen backend and our FlexAttention kernel.

The choices: one ATen extern choice per backend in the op's ``backends`` (timed by
``sdpa_ops.forward`` / ``backward``, the output viewed in the choice set's strides,
``aten_choices``; the backward's timing passes grad_out as out, the same shape and
layout), and ours: the
lowering calls Inductor's flex_attention (flex_attention_backward) lowering with
``CUTEDSL`` on (``inductor/flex.py`` adds our choices) on a BlockMask it builds, with
two of that module's globals wrapped for the call: the Triton template (no Triton choice
is made: the set is ATen's and ours) and ``autotune_select_algorithm`` (the ATen
choices join ours on flex's input nodes; its fake BlockMask generators, which time every
block, are replaced by the real tables). The BlockMask: 128x128 blocks, for causal
attention (Lq = Lk) the diagonal blocks partial (mask_mod ``m >= n``) and those below
full, else every block full; its tables are small int32 graph computations. A bias
(additive, broadcast over heads) is the score_mod ``score + bias[b, h, m, n]``, a
captured tensor.

The winner: ours returns flex's output, its logsumexp (log2 units) times ln 2 for the
canonical one (the backward's divided by it); an ATen backend makes the op itself the
output code's call, with that backend alone (``cutedsl::sdpa(..., 'cudnn')``).

The inputs' layout: ``sdpa_layout.py``. The winner's output strides are the op's where
an ATen backend won, flex's (the query's order) where ours did; where a graph output or
the backward needs the traced strides (efficient's (B, L, H, D) order for a (B, H, L, D)
query), Inductor copies.

Failure semantics: a problem ours cannot take (``why_not_ours``, the templates'
refusals, a flex lowering that raises) keeps the ATen choices, with the reason logged
(warning); one eligible backend and nothing else is called untimed.
"""

from __future__ import annotations

import functools
import importlib
import logging
from typing import Any

import torch

from ..compile.specs import static_ints
from ..template.caller import CuteDSLTemplateCaller
from . import sdpa_ops

log = logging.getLogger(__name__)

aten = torch.ops.aten
_FLEX = "torch._inductor.kernel.flex.flex_attention"
_FWD_TABLES = 5   # flex's forward inputs: q, k, v, lse, max, then its 4 tables
_BWD_TABLES = 8   # the backward's: q, k, v, lse, delta, grad_out, dq, dv, then 8


def _time_forward(*inputs: torch.Tensor, backend: str, slots: tuple[int, ...],
                  is_causal: bool, scale: float, stride: tuple[int, ...]) -> torch.Tensor:
    """One ATen backend's forward, for timing; ``slots``: where q, k, v, bias are.
    ``stride``: the choice set's (see ``aten_choices``)."""
    q, k, v = (inputs[i] for i in slots[:3])
    bias = inputs[slots[3]] if slots[3] >= 0 else None
    out = sdpa_ops.forward(backend, q, k, v, bias, is_causal, scale)[0]
    return out.as_strided(out.shape, stride)


def _time_backward(*inputs: torch.Tensor, backend: str, slots: tuple[int, ...],
                   is_causal: bool, scale: float, stride: tuple[int, ...]) -> torch.Tensor:
    """One ATen backend's backward, for timing (dk); ``slots``: q, k, v, grad_out, lse,
    bias."""
    q, k, v, grad_out, lse = (inputs[i] for i in slots[:5])
    bias = inputs[slots[5]] if slots[5] >= 0 else None
    dk = sdpa_ops.backward(backend, grad_out, q, k, v, grad_out, lse, bias, is_causal,
                           scale)[1]
    return dk.as_strided(dk.shape, stride)


@functools.cache
def _externs() -> dict[tuple[str, bool], Any]:
    """The ATen choices, by (backend, backward); made once (names are global)."""
    from torch._inductor.select_algorithm import ExternKernelChoice

    made = {}
    for name in sdpa_ops.BACKENDS:
        for backward, fn in ((False, _time_forward), (True, _time_backward)):
            suffix = "_backward" if backward else ""
            made[name, backward] = ExternKernelChoice(
                fn, name=f"cutedsl_sdpa_{name}{suffix}", has_out_variant=False)
    return made


def backend_of(node: Any) -> str | None:
    """The ATen backend whose choice made ``node``, else None (ours)."""
    buf = getattr(getattr(node, "data", None), "data", None)
    kernel = str(getattr(buf, "python_kernel_name", "") or "")
    for (name, backward), choice in _externs().items():
        if kernel.endswith(choice.name):
            return name
    return None


def aten_choices(backward: bool, names: list[str], nodes: list[Any], layout: Any,
                 slots: tuple[int, ...], is_causal: bool, scale: float) -> list[Any]:
    """The ATen choices, for timing: Inductor asserts that a timed output has the choice
    set's strides, which a backend's own may not be (efficient's forward writes (B, L, H,
    D) order), so each returns its (dense) output viewed in them; the view is never read
    (only copied, where Inductor checks choices against each other), and the backend
    that wins runs as itself. None with dynamic strides."""
    stride = static_ints(layout.stride)
    if stride is None:
        return []
    return [_externs()[name, backward].bind(nodes, layout, backend=name, slots=slots,
                                            is_causal=is_causal, scale=scale,
                                            stride=tuple(stride))
            for name in names]


def why_not_ours(q: Any, k: Any, bias: Any, is_causal: bool) -> str | None:
    """Why our kernels are not offered here (before the templates' own checks)."""
    sizes = [static_ints(n.get_size()) for n in (q, k)]
    if any(s is None for s in sizes):
        return "dynamic shapes"
    if is_causal and sizes[0][2] != sizes[1][2]:
        return f"causal with Lq {sizes[0][2]} != Lk {sizes[1][2]} (SDPA aligns it top-left)"
    if bias is not None and bias.get_dtype() not in (torch.bfloat16, torch.float16,
                                                     torch.float32):
        return f"a {bias.get_dtype()} mask"
    return None


class _NoTriton:
    """The Triton template, making no choice (the set is ATen's and ours)."""

    def __init__(self, template: Any) -> None:
        self.template = template

    def maybe_append_choice(self, *args: Any, **kwargs: Any) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.template, name)


class ChoiceSet:
    """One flex lowering run as our SDPA choice: the ATen choices join ours where it
    autotunes; ``winner`` is then the ATen backend that won, or None (ours)."""

    def __init__(self, kind: str, names: list[str], slots: tuple[int, ...],
                 is_causal: bool, scale: float, gen_fns: dict[int, Any]) -> None:
        self.kind, self.names, self.slots = kind, names, slots
        self.is_causal, self.scale, self.gen_fns = is_causal, scale, gen_fns
        self.module = importlib.import_module(_FLEX)
        self.winner: str | None = None
        self.ours = 0

    def select(self, name: str, choices: list[Any], nodes: list[Any], layout: Any,
               *args: Any, **kwargs: Any) -> Any:
        if name != self.kind:
            return self.real(name, choices, nodes, layout, *args, **kwargs)
        ours = [c for c in choices if isinstance(c, CuteDSLTemplateCaller)]
        self.ours = len(ours)
        externs = aten_choices(self.kind.endswith("backward"), self.names, list(nodes),
                               layout, self.slots, self.is_causal, self.scale)
        kwargs["input_gen_fns"] = {**(kwargs.get("input_gen_fns") or {}), **self.gen_fns}
        kwargs["return_multi_template"] = False  # decided now: the winner picks the IR
        result = self.real(name, ours + externs, nodes, layout, *args, **kwargs)
        self.winner = backend_of(result[0] if isinstance(result, tuple) else result)
        return result

    def run(self, lowering: Any, *args: Any) -> Any:
        template_name = f"{self.kind}_template"
        template = getattr(self.module, template_name)
        self.real = self.module.autotune_select_algorithm
        setattr(self.module, template_name, _NoTriton(template))
        self.module.autotune_select_algorithm = self.select
        try:
            return lowering(*args)
        finally:
            setattr(self.module, template_name, template)
            self.module.autotune_select_algorithm = self.real


def _layout_of(val: torch.Tensor) -> Any:
    from torch._inductor import ir

    return ir.FixedLayout(val.device, val.dtype, list(val.shape), list(val.stride()))


def _realized(nodes: list[Any]) -> list[Any]:
    from torch._inductor import ir

    return [ir.ExternKernel.realize_input(n) for n in nodes]


def _fallback(op: Any, *args: Any) -> Any:
    from torch._inductor.lowering import fallback_handler

    return fallback_handler(op, add_to_fallback_set=False)(*args)


def _aten_only(backward: bool, names: list[str], nodes: list[Any], slots: tuple[int, ...],
               is_causal: bool, scale: float) -> str:
    """The winner among the ATen backends alone (the only one, untimed)."""
    from ..autotune.select import autotune_select_algorithm

    if len(names) == 1:
        return names[0]
    val = _current_val()[1 if backward else 0]
    layout = _layout_of(val)
    choices = aten_choices(backward, names, nodes, layout, slots, is_causal, scale)
    if len(choices) < 2:
        return names[0]
    node = autotune_select_algorithm("cutedsl_sdpa_backward" if backward else "cutedsl_sdpa",
                                     choices, nodes, layout, return_multi_template=False)
    return backend_of(node) or names[0]


def _current_val() -> Any:
    from torch._inductor.virtualized import V

    return V.graph.current_node.meta["val"]


def _ours(kind: str, names: list[str], q: Any, k: Any, bias: Any, is_causal: bool,
          scale: float, hop_args: Any) -> tuple[Any, str | None] | None:
    """flex's lowering of our choice with the ATen choices beside it: (its result, the
    ATen winner or None: ours won), or None where flex's lowering is not reached or
    fails (the reason logged); where the templates refuse the problem, the ATen choices
    are timed there alone."""
    from torch._inductor.lowering import lowerings

    from . import sdpa_flex

    reason = why_not_ours(q, k, bias, is_causal)
    if reason is None:
        lq, lk = (int(n.get_size()[2]) for n in (q, k))
        blocks = sdpa_flex.blocks_for(lq, lk, is_causal)
        device = q.get_device()
        base = _FWD_TABLES if kind == "flex_attention" else _BWD_TABLES
        order = (sdpa_flex.TABLE_NAMES[:4] if kind == "flex_attention" else
                 ("kv_num_blocks", "kv_indices", "q_num_blocks", "q_indices",
                  "full_kv_num_blocks", "full_kv_indices", "full_q_num_blocks",
                  "full_q_indices"))
        gen = {base + i: (lambda node, name=name: sdpa_flex.table_tensors(
            blocks, node.get_device())[name]) for i, name in enumerate(order)}
        nbias = base + len(order) if bias is not None else -1
        slots = ((0, 1, 2, nbias) if kind == "flex_attention" else (0, 1, 2, 5, 3, nbias))
        offer = ChoiceSet(kind, names, slots, is_causal, scale, gen)
        try:
            args = hop_args(blocks, sdpa_flex.tables(blocks, device))
            result = offer.run(lowerings[getattr(torch.ops.higher_order, kind)], *args)
        except Exception as err:  # never a failed compile: the ATen choices stay
            log.debug("SDPA: flex's %s lowering failed", kind, exc_info=True)
            reason = f"flex's lowering failed: {type(err).__name__}: {err}"
        else:
            if not offer.ours:  # the templates refused: flex.py logged why
                log.warning("no CuteDSL SDPA %s choice: the FlexAttention templates refused "
                            "it; ATen's backends %s stay", kind, names)
            return result, offer.winner
    log.warning("no CuteDSL SDPA %s choice: %s; ATen's backends %s stay", kind, reason,
                names)
    return None


def lower_sdpa(q: Any, k: Any, v: Any, bias: Any, is_causal: bool, scale: float,
               backends: str) -> Any:
    """Inductor lowering of ``cutedsl::sdpa``."""
    from torch._inductor.lowering import lowerings

    from . import sdpa_flex

    op = torch.ops.cutedsl.sdpa.default
    names = backends.split(",")

    def hop_args(blocks: Any, tables: Any) -> tuple[Any, ...]:
        score, _, mask = sdpa_flex.graphs(q.get_dtype(), is_causal, bias is not None)
        block_mask = sdpa_flex.block_mask(int(q.get_size()[2]), int(k.get_size()[2]),
                                          tables, sdpa_flex.subgraph("sdpa_mask", mask))
        options = sdpa_flex.kernel_options(q.get_dtype(), q.get_device())
        return (q, k, v, sdpa_flex.subgraph("sdpa_score", score), block_mask, scale,
                options, (bias,) if bias is not None else (), ())

    found = _ours("flex_attention", names, q, k, bias, is_causal, scale, hop_args)
    if found is not None:
        (out, lse, _), winner = found
        if winner is None:
            return out, lowerings[aten.mul.Tensor](lse, sdpa_ops.LN2)
    else:
        nodes = _realized([q, k, v] + ([bias] if bias is not None else []))
        winner = _aten_only(False, names, nodes, (0, 1, 2, 3 if bias is not None else -1),
                            is_causal, scale)
    return _fallback(op, q, k, v, bias, is_causal, scale, winner)


def lower_sdpa_backward(grad_out: Any, q: Any, k: Any, v: Any, out: Any, lse: Any,
                        bias: Any, is_causal: bool, scale: float, backends: str) -> Any:
    """Inductor lowering of ``cutedsl::sdpa_backward``."""
    from torch._inductor.lowering import lowerings

    from . import sdpa_flex

    op = torch.ops.cutedsl.sdpa_backward.default
    names = backends.split(",")

    def hop_args(blocks: Any, tables: Any) -> tuple[Any, ...]:
        score, joint, mask = sdpa_flex.graphs(q.get_dtype(), is_causal, bias is not None)
        block_mask = sdpa_flex.block_mask(int(q.get_size()[2]), int(k.get_size()[2]),
                                          tables, sdpa_flex.subgraph("sdpa_mask", mask))
        options = sdpa_flex.kernel_options(q.get_dtype(), q.get_device())
        lse2 = lowerings[aten.mul.Tensor](lse, 1.0 / sdpa_ops.LN2)
        return (q, k, v, out, lse2, grad_out, None, sdpa_flex.subgraph("sdpa_score", score),
                sdpa_flex.subgraph("sdpa_joint", joint), block_mask, scale, options,
                (bias,) if bias is not None else (), ())

    found = _ours("flex_attention_backward", names, q, k, bias, is_causal, scale, hop_args)
    if found is not None:
        (dq, dk, dv, *_), winner = found
        if winner is None:
            return dq, dk, dv
    else:
        nodes = _realized([q, k, v, grad_out, lse] + ([bias] if bias is not None else []))
        winner = _aten_only(True, names, nodes, (0, 1, 2, 3, 4, 5 if bias is not None else -1),
                            is_causal, scale)
    return _fallback(op, grad_out, q, k, v, out, lse, bias, is_causal, scale, winner)


def install_sdpa() -> None:
    """Register the two lowerings and the joint-graph pass (idempotent)."""
    from torch._inductor.lowering import add_layout_constraint, lowerings, register_lowering

    from .sdpa_layout import constrain_inputs
    from .sdpa_pass import install_sdpa_pass

    for op, lowering in ((torch.ops.cutedsl.sdpa.default, lower_sdpa),
                         (torch.ops.cutedsl.sdpa_backward.default, lower_sdpa_backward)):
        if op not in lowerings:
            register_lowering(op, type_promotion_kind=None)(lowering)
            add_layout_constraint(op, constrain_inputs)
    _externs()
    install_sdpa_pass()
