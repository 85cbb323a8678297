"""Our FlexAttention forward as a choice of Inductor's flex_attention lowering.

``install_flex`` wraps the lowerings of the ``flex_attention`` HOP (and, only to strip
our option, of ``flex_attention_backward``). It is switched on per call by
``kernel_options={"CUTEDSL": True}`` (torch validates ``BACKEND`` against its own
names, so the switch is a key of ours, removed before Inductor's lowering sees the
options) or for every call by ``config.flex_attention``. Switched on, Inductor's own
lowering runs with two of its module globals wrapped for the duration of the call:
``flex_attention_template.maybe_append_choice`` (which hands us, on its first call,
the subgraphs and kernel options it builds its Triton choices from) and
``autotune_select_algorithm`` (where, for ``"flex_attention"``, our choices join the
Triton ones on the same input nodes -- q, k, v, lse, max, the BlockMask's four
tensors, then the captured buffers -- so autotuning times them against each other).
Both names exist in torch 2.11 and 2.13's ``torch/_inductor/kernel/flex/flex_attention.py``;
where either is missing nothing is wrapped and Inductor's lowering runs unchanged (a
warning says so once).

A BlockMask without full blocks (flex's "no mask" one) makes the lowering pass
``empty(0)`` tensors in their place, never read, which no CuTe kernel can take (a
0-extent layout): within the call its ``empty`` makes them of one element instead.

Failure semantics: switched off, nothing changes. Switched on, a problem our kernel
cannot take (a reason from ``kernels/attention/template.py``), a choice that fails to
render (a ``SubgraphError``: a score_mod that does not translate) and one that fails to
compile or run are dropped with a logged reason; the Triton choices remain. The paths
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
from collections.abc import Iterator
from typing import Any

from .. import config
from ..exc import ChoiceError, format_params

log = logging.getLogger(__name__)

OPTION = "CUTEDSL"  # kernel_options={"CUTEDSL": True}
_MODULE = "torch._inductor.kernel.flex.flex_attention"
_KERNEL_OPTIONS_ARG = 6  # the HOPs' kernel_options argument (forward and backward)


@functools.cache
def _warn_once(message: str) -> None:
    log.warning(message)


def _split_options(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple, dict, bool]:
    """The HOP's arguments with our key removed from kernel_options, and its value."""
    args, kwargs = list(args), dict(kwargs)
    if len(args) > _KERNEL_OPTIONS_ARG:
        options = dict(args[_KERNEL_OPTIONS_ARG])
        asked = bool(options.pop(OPTION, False))
        args[_KERNEL_OPTIONS_ARG] = options
    else:
        options = dict(kwargs.get("kernel_options", {}))
        asked = bool(options.pop(OPTION, False))
        kwargs["kernel_options"] = options
    return tuple(args), kwargs, asked


class _Offer:
    """One lowering's interception: what the Triton template was given, and our choices
    added where the lowering autotunes."""

    def __init__(self, module: Any) -> None:
        self.module = module
        self.template = module.flex_attention_template
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
        if name == "flex_attention":
            self.offer(choices, list(input_nodes), layout)
        return self.select(name, choices, input_nodes, layout, *args, **kwargs)

    def offer(self, choices: list[Any], nodes: list[Any], layout: Any) -> None:
        if self.seen is None:
            log.debug("flex_attention: the Triton template made no choice; none of ours")
            return
        options = {k: self.seen.get(k) for k in ("SM_SCALE", "SPARSE_Q_BLOCK_SIZE",
                                                 "SPARSE_KV_BLOCK_SIZE", "HAS_FULL_BLOCKS")}
        try:  # lazily: the kernel imports cutlass
            from ..kernels.attention.template import flex_choices, flex_template
        except ImportError as err:
            _warn_once(f"CuteDSL flex_attention is on but CuTe DSL cannot be imported "
                       f"({err}): no CuteDSL choice")
            return
        before = len(choices)
        reason = flex_choices(choices, nodes, layout, list(self.seen.get("subgraphs") or []),
                              options)
        if config.flex_only_ours:
            if reason is not None:
                raise ChoiceError(template=flex_template.name, params=format_params(options),
                                  cause=reason)
            del choices[:before]
        if reason is not None:
            log.warning("no CuteDSL flex_attention choice (template %s, params %s): %s",
                        flex_template.name, options, reason)
        else:
            log.debug("flex_attention: %d CuteDSL choice(s) offered", len(choices) - before)

    def nonempty(self, *size: Any, **kwargs: Any) -> Any:
        """``empty`` with a 0-element 1-D size made 1 (the unused full-block tensors)."""
        if size in ((0,), ([0],)):
            size = (1,)
        return self.empty(*size, **kwargs)

    @contextlib.contextmanager
    def patched(self) -> Iterator[None]:
        self.module.flex_attention_template = self
        self.module.autotune_select_algorithm = self.autotune_select_algorithm
        if self.empty is not None:
            self.module.empty = self.nonempty
        try:
            yield
        finally:
            self.module.flex_attention_template = self.template
            self.module.autotune_select_algorithm = self.select
            if self.empty is not None:
                self.module.empty = self.empty


def _flex_module() -> Any:
    try:
        module = importlib.import_module(_MODULE)
    except ImportError:
        return None
    if not all(hasattr(module, n) for n in ("flex_attention_template",
                                            "autotune_select_algorithm")):
        return None
    return module


def _forward(original: Any, *args: Any, **kwargs: Any) -> Any:
    args, kwargs, asked = _split_options(args, kwargs)
    if not (asked or config.flex_attention):
        return original(*args, **kwargs)
    module = _flex_module()
    if module is None:
        _warn_once(f"CuteDSL flex_attention is on but this torch's {_MODULE} lacks "
                   "flex_attention_template / autotune_select_algorithm: no CuteDSL choice")
        return original(*args, **kwargs)
    with _Offer(module).patched():
        return original(*args, **kwargs)


def _backward(original: Any, *args: Any, **kwargs: Any) -> Any:
    args, kwargs, _ = _split_options(args, kwargs)
    return original(*args, **kwargs)


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
