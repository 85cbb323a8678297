"""Our FlexAttention forward and backward as choices of Inductor's flex_attention and
flex_attention_backward lowerings.

``install_flex`` wraps the lowerings of the ``flex_attention`` and
``flex_attention_backward`` HOPs. Either is switched on per call by
``kernel_options={"CUTEDSL": True}`` (torch validates ``BACKEND`` against its own
names, so the switch is a key of ours, removed before Inductor's lowering sees the
options; the forward's kernel options reach the backward HOP too, so one switch turns
on both) or for every call by ``config.flex_attention``. Switched on, Inductor's own
lowering runs with two of its module globals wrapped for the duration of the call: the
Triton template's ``maybe_append_choice`` (``flex_attention_template`` /
``flex_attention_backward_template``: it hands us, on its first call, the subgraphs
and kernel options it builds its Triton choices from) and ``autotune_select_algorithm``
(where, for ``"flex_attention"`` / ``"flex_attention_backward"``, our choices join the
Triton ones on the same input nodes, so autotuning times them against each other: the
forward's q, k, v, lse, max, the BlockMask's four tensors, then the captured buffers;
the backward's q, k, v, lse, delta, grad_out, grad_query, grad_value, the BlockMask's
eight tensors, then the captured buffers). torch 2.15's forward autotunes on its first
choice's input nodes instead (a Triton choice's: the template's, then the buffers its
subgraphs read, which may be the inputs of a capture's producer the subgraph inlined
rather than the capture), so none where the Triton template made no choice: there ours
bring their own, which autotuning then takes, built the same way.
These names exist in torch 2.11 to 2.15's
``torch/_inductor/kernel/flex/flex_attention.py`` (2.13's select returns a pair, 2.11's
the node: passed through untouched); where one is missing nothing is wrapped and
Inductor's lowering runs unchanged (a warning says so once).

A BlockMask without full blocks (flex's "no mask" one) makes the lowering pass
``empty(0)`` tensors in their place (two in the forward, four in the backward), never
read, which no CuTe kernel can take (a 0-extent layout): within the call its ``empty``
makes them of one element instead.

Failure semantics: switched off, nothing changes. Switched on, a problem our kernel
cannot take (a reason from ``kernels/attention/template.py``), a choice that fails to
render (a ``SubgraphError``: a score_mod that does not translate) and one that fails to
compile or run are dropped with a logged reason; the Triton choices remain (the
backward's captured tensors that need gradients count too: their scatters must translate,
``kernels/attention/bwd_template.py``). The paths
that do not reach the Triton template (flex decoding, the FLASH backend, CPU) get no
choice of ours (logged at debug): under ``BACKEND="AUTO"`` a query shorter than 128
takes flex decoding; ``BACKEND="TRITON"`` keeps it on the template path.

``config.flex_only_ours`` (for benchmarks that time our kernel alone): where ours is
switched on and the lowering reaches the Triton template, the Triton choices are dropped
and a problem ours refuses raises ``ChoiceError`` with the reason, so the compile fails
instead of falling back; if every choice of ours then fails to compile, Inductor's
autotuning has none left and fails too.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from .. import config
from ..exc import ChoiceError, format_params

log = logging.getLogger(__name__)

OPTION = "CUTEDSL"  # kernel_options={"CUTEDSL": True}
_MODULE = "torch._inductor.kernel.flex.flex_attention"
_FORWARD_OPTIONS_ARG = 6  # the HOPs' kernel_options argument
_BACKWARD_OPTIONS_ARG = 11
_OPTION_KEYS = ("SM_SCALE", "SPARSE_Q_BLOCK_SIZE", "SPARSE_KV_BLOCK_SIZE", "HAS_FULL_BLOCKS")


@functools.cache
def _warn_once(message: str) -> None:
    log.warning(message)


def switched_on(node: Any) -> bool:
    """``node`` (an FX node) calls a flex HOP with ours switched on: its kernel options
    (argument 6 of the forward, 11 of the backward, in dynamo's graph as in AOT's) hold
    ``CUTEDSL``, or ``config.flex_attention``."""
    hops = torch.ops.higher_order
    for name, index in (("flex_attention", _FORWARD_OPTIONS_ARG),
                        ("flex_attention_backward", _BACKWARD_OPTIONS_ARG)):
        if hasattr(hops, name) and node.target is getattr(hops, name):
            options = (node.args[index] if len(node.args) > index
                       else node.kwargs.get("kernel_options"))
            return config.flex_attention or (
                isinstance(options, Mapping) and bool(options.get(OPTION)))
    return False


def _split_options(args: tuple[Any, ...], kwargs: dict[str, Any],
                   index: int = _FORWARD_OPTIONS_ARG) -> tuple[tuple, dict, bool]:
    """The HOP's arguments with our key removed from kernel_options (argument ``index``),
    and its value; unchanged and False where no mapping is there (a torch whose HOP
    takes its arguments otherwise: warned once, never an error in the user's compile)."""
    args, kwargs = list(args), dict(kwargs)
    found = args[index] if len(args) > index else kwargs.get("kernel_options", {})
    if not isinstance(found, Mapping):
        _warn_once(f"CuteDSL flex_attention: this torch's flex HOP has no kernel_options "
                   f"mapping at argument {index} (found {type(found).__name__}): no "
                   f"CuteDSL choice")
        return tuple(args), kwargs, False
    options = dict(found)
    asked = bool(options.pop(OPTION, False))
    if len(args) > index:
        args[index] = options
    else:
        kwargs["kernel_options"] = options
    return tuple(args), kwargs, asked


class _Offer:
    """One lowering's interception: what the Triton template was given, and our choices
    added where the lowering autotunes. ``kind``: ``"flex_attention"`` (the forward) or
    ``"flex_attention_backward"``, the Triton template's module global then being
    ``<kind>_template`` and the autotuning's name ``kind``."""

    def __init__(self, module: Any, kind: str = "flex_attention") -> None:
        self.module = module
        self.kind = kind
        self.template = getattr(module, f"{kind}_template")
        self.select = module.autotune_select_algorithm
        self.empty = getattr(module, "empty", None)
        self.seen: dict[str, Any] | None = None

    def maybe_append_choice(self, *args: Any, **kwargs: Any) -> Any:
        if self.seen is None:
            self.seen = dict(kwargs)
        return self.template.maybe_append_choice(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:  # the rest of the Triton template
        return getattr(self.template, name)

    def autotune_select_algorithm(self, name: str, choices: list[Any], input_nodes: list[Any],
                                  layout: Any, *args: Any, **kwargs: Any) -> Any:
        if name == self.kind and self.seen is not None:
            input_nodes = list(input_nodes) or self.own_inputs()
            self.offer(choices, input_nodes, layout)
        elif name == self.kind:
            log.debug("%s: the lowering did not reach the Triton template; no choice of ours",
                      self.kind)
        return self.select(name, choices, input_nodes, layout, *args, **kwargs)

    def own_inputs(self) -> list[Any]:
        """The Triton template's input nodes, then the buffers the subgraphs read (the
        captured tensors, or the producers the subgraph inlined), each once, in order."""
        from torch._inductor.ir import IRNode
        from torch._inductor.virtualized import V

        nodes = list(self.seen.get("input_nodes") or [])
        names = {n.get_name() for n in nodes}
        subgraphs = [s for s in self.seen.get("subgraphs") or [] if isinstance(s, IRNode)]
        for name in (name for s in subgraphs for name in s.get_read_names()):
            node = V.graph.try_get_buffer(name)  # None: a placeholder (score, b, ..)
            if node is not None and name not in names:
                nodes.append(node)
                names.add(name)
        return nodes

    def offer(self, choices: list[Any], nodes: list[Any], layout: Any) -> None:
        options = {k: self.seen.get(k) for k in _OPTION_KEYS}
        try:  # lazily: the kernels import cutlass
            if self.kind == "flex_attention":
                from ..kernels.attention.template import flex_choices as make
                from ..kernels.attention.template import flex_template as template
            else:
                from ..kernels.attention.bwd_template import flex_bwd_choices as make
                from ..kernels.attention.bwd_template import flex_bwd_template as template
        except ImportError as err:
            _warn_once(f"CuteDSL flex_attention is on but CuTe DSL cannot be imported "
                       f"({err}): no CuteDSL choice")
            return
        before = len(choices)
        reason = make(choices, nodes, layout, list(self.seen.get("subgraphs") or []), options)
        if config.flex_only_ours:
            if reason is not None:
                raise ChoiceError(template=template.name, params=format_params(options),
                                  cause=reason)
            del choices[:before]
        if reason is not None:
            log.warning("no CuteDSL %s choice (template %s, params %s): %s", self.kind,
                        template.name, options, reason)
        else:
            log.debug("%s: %d CuteDSL choice(s) offered", self.kind, len(choices) - before)

    def nonempty(self, *size: Any, **kwargs: Any) -> Any:
        """``empty`` with a 0-element 1-D size made 1 (the unused full-block tensors)."""
        if size in ((0,), ([0],)):
            size = (1,)
        return self.empty(*size, **kwargs)

    @contextlib.contextmanager
    def patched(self) -> Iterator[None]:
        template_name = f"{self.kind}_template"
        setattr(self.module, template_name, self)
        self.module.autotune_select_algorithm = self.autotune_select_algorithm
        if self.empty is not None:
            self.module.empty = self.nonempty
        try:
            yield
        finally:
            setattr(self.module, template_name, self.template)
            self.module.autotune_select_algorithm = self.select
            if self.empty is not None:
                self.module.empty = self.empty


def _flex_module(kind: str) -> Any:
    try:
        module = importlib.import_module(_MODULE)
    except ImportError:
        return None
    if not all(hasattr(module, n) for n in (f"{kind}_template", "autotune_select_algorithm")):
        return None
    return module


def _lower(kind: str, index: int, original: Any, *args: Any, **kwargs: Any) -> Any:
    args, kwargs, asked = _split_options(args, kwargs, index)
    if not (asked or config.flex_attention):
        return original(*args, **kwargs)
    module = _flex_module(kind)
    if module is None:
        _warn_once(f"CuteDSL flex_attention is on but this torch's {_MODULE} lacks "
                   f"{kind}_template / autotune_select_algorithm: no CuteDSL {kind} choice")
        return original(*args, **kwargs)
    with _Offer(module, kind).patched():
        return original(*args, **kwargs)


_forward = functools.partial(_lower, "flex_attention", _FORWARD_OPTIONS_ARG)
_backward = functools.partial(_lower, "flex_attention_backward", _BACKWARD_OPTIONS_ARG)


def _wrap(op: Any, body: Any) -> None:
    from torch._inductor.lowering import lowerings

    current = lowerings.get(op)
    if current is None or getattr(current, "_cutedsl_flex", False):
        return
    wrapped = functools.wraps(current)(functools.partial(body, current))
    wrapped._cutedsl_flex = True  # type: ignore[attr-defined]
    lowerings[op] = wrapped


def install_flex() -> None:
    """Wrap the flex HOPs' lowerings (idempotent; importing the lowerings registers them)."""
    import torch._inductor.lowering  # noqa: F401

    hops = torch.ops.higher_order
    if hasattr(hops, "flex_attention"):
        _wrap(hops.flex_attention, _forward)
    if hasattr(hops, "flex_attention_backward"):
        _wrap(hops.flex_attention_backward, _backward)
