"""Our FP8 GEMM as choices of Inductor's ``torch._scaled_mm`` lowering (``config.fp8``).

Inductor lowers ``aten._scaled_mm.default`` in ``tuned_scaled_mm``
(``torch/_inductor/kernel/mm.py`` in torch 2.11 to 2.15), which builds its choice list
through ``V.choices.get_template_configs(kernel_inputs, templates, "scaled_mm", ...)``
with the input nodes ``[a, b, scale_a, scale_b]`` and the bias if there is one; our
choices class (``choices.py``) appends ours there (``offer``). What those arguments do
not say -- ``use_fast_accum`` and ``scale_result`` -- ``install_scaled_mm`` keeps for
the duration of the lowering's call by wrapping it (``_CALL``). torch 2.13's
``_scaled_mm_v2`` lowering names its choices "scaled_mm" too but is not wrapped: with
no call recorded, no choice of ours (logged at debug).

Failure semantics: off (``config.fp8``, or CUTEDSL not among the GEMM backends under
max-autotune), nothing changes. On, a problem the kernel cannot take gets no choice,
with the reason at debug (``kernels/gemm/scaled_choices.py``); ATen's and Triton's
choices remain. A torch whose lowering is not where it is looked for is left unwrapped
(a warning, once), and then offers nothing of ours.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import logging
from collections.abc import Iterator
from typing import Any

import torch

log = logging.getLogger(__name__)

OP_NAME = "scaled_mm"  # tuned_scaled_mm's name for its choices


@dataclasses.dataclass(frozen=True)
class ScaledMmCall:
    """What one ``_scaled_mm`` lowering call asks beyond its input nodes."""

    use_fast_accum: bool
    scale_result: bool  # an output scale was given (fp8 output), which ours does not apply


_CALL: contextvars.ContextVar[ScaledMmCall | None] = contextvars.ContextVar(
    "cutedsl_scaled_mm_call", default=None)


@functools.cache
def _warn_once(message: str) -> None:
    log.warning(message)


def _call_of(mat_a: Any, mat_b: Any, scale_a: Any, scale_b: Any, bias: Any = None,
             scale_result: Any = None, out_dtype: Any = None, use_fast_accum: bool = False,
             layout: Any = None) -> ScaledMmCall:
    """The call's arguments bound as aten's ``_scaled_mm`` schema (and the lowering's
    ``layout``) takes them."""
    return ScaledMmCall(bool(use_fast_accum), scale_result is not None)


@contextlib.contextmanager
def _recorded(call: ScaledMmCall) -> Iterator[None]:
    token = _CALL.set(call)
    try:
        yield
    finally:
        _CALL.reset(token)


def _lower(original: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        call = _call_of(*args, **kwargs)
    except TypeError as err:  # another schema: run the lowering without a call of ours
        _warn_once(f"CuteDSL scaled_mm: this torch's _scaled_mm lowering takes other "
                   f"arguments ({err}): no CuteDSL FP8 choice")
        return original(*args, **kwargs)
    with _recorded(call):
        return original(*args, **kwargs)


def install_scaled_mm() -> None:
    """Wrap ``aten._scaled_mm.default``'s lowering (idempotent)."""
    from torch._inductor.lowering import lowerings

    op = torch.ops.aten._scaled_mm.default
    current = lowerings.get(op)
    if current is None:
        _warn_once("CuteDSL scaled_mm: this torch has no _scaled_mm lowering: no CuteDSL "
                   "FP8 choice")
        return
    if getattr(current, "_cutedsl_scaled_mm", False):
        return
    wrapped = functools.wraps(current)(functools.partial(_lower, current))
    wrapped._cutedsl_scaled_mm = True  # type: ignore[attr-defined]
    lowerings[op] = wrapped


def offer(choices: list[Any], nodes: list[Any], layout: Any) -> str | None:
    """Append our FP8 choices for the ``_scaled_mm`` being lowered (``nodes``: the
    lowering's input nodes); None, or why there are none (logged at debug)."""
    from ..kernels.gemm.scaled_choices import scaled_mm_choices

    call = _CALL.get()
    reason = None
    if call is None:
        reason = "not lowered through aten._scaled_mm (its v2, or an unwrapped lowering)"
    elif call.scale_result:
        reason = "an output scale (scale_result) is not applied by the kernel"
    if reason is not None:
        log.debug("no CuteDSL scaled_mm choice: %s", reason)
        return reason
    return scaled_mm_choices(choices, nodes, layout, call.use_fast_accum)
