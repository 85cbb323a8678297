"""SwiGLU as one GEMM: ``silu(x @ w_gate) * (x @ w_up)`` in a single kernel.

Fusing the multiply into the second GEMM's epilogue still writes ``silu(x @ w_gate)``
to memory and reads it back, and runs two kernels. ``SwiGLUPass`` (``swiglu_pass.py``)
replaces the pattern with the custom op ``cutedsl::swiglu_mm(x, w_gate, w_up)``, whose lowering
autotunes the GEMM template's two-weight configs (``swiglu_choices``) against an ATen
fallback (two cuBLAS GEMMs and in-place silu and multiply, ``cutedsl_swiglu_mm_aten``).
The fallback stands in for Inductor's own lowering of the pattern, which costs less
(two autotuned GEMMs, the multiply fused into the second or one pointwise kernel, not
two): where it wins, the pattern is lowered that way instead (on the H200 at
8192x4096x14336 the fallback ran at 667 TFLOP/s, Inductor's lowering at 696).
Where our kernel wins, our ``config.fused_choice_candidates`` fastest configs are timed
again in interleaved rounds and the fastest taken (``autotune/retime.py``, which keeps the
winner as a tuning decision, locally and remotely, so that a warm machine does not time
it again): the two-weight configs of one shape are often within a few percent, the noise
of one timing pass.

Failure semantics: the lowering offers the template's choices only where the problem
suits the kernel; where none is offered, or none beats the ATen fallback, it lowers the
original decomposition through Inductor's own lowerings, so the graph costs what it would
have. A choice that fails to compile or run is dropped by the autotuner.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
from torch._inductor.select_algorithm import ExternKernelChoice

from .. import config
from ..autotune.retime import choice_calls, fastest_in_rounds, recording_timings
from ..autotune.select import autotune_select_algorithm
from ..template.caller import CuteDSLTemplateCaller

log = logging.getLogger(__name__)

aten, prims = torch.ops.aten, torch.ops.prims


@torch.library.custom_op("cutedsl::swiglu_mm", mutates_args=())
def swiglu_mm(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor) -> torch.Tensor:
    """``silu(x @ w_gate) * (x @ w_up)`` for 2-D x (M, K) and weights (K, N)."""
    out = x.new_empty(x.shape[0], w_gate.shape[1])
    return swiglu_mm_out(x, w_gate, w_up, out=out)


@swiglu_mm.register_fake
def _(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], w_gate.shape[1])


def swiglu_mm_out(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, *,
                  out: torch.Tensor) -> torch.Tensor:
    torch.mm(x, w_gate, out=out)
    torch.nn.functional.silu(out, inplace=True)
    return out.mul_(torch.mm(x, w_up))


# made at import, so that cached output code that calls it finds it registered
swiglu_mm_aten = ExternKernelChoice(swiglu_mm_out, name="cutedsl_swiglu_mm_aten",
                                    has_out_variant=True)


def lower_swiglu_mm(x: Any, w_gate: Any, w_up: Any) -> Any:
    """Inductor lowering of ``cutedsl::swiglu_mm`` (see the module docstring)."""
    from torch._inductor import ir

    # lazily: the kernel's modules import cutlass (slow, and optional until a GEMM runs)
    from ..kernels.gemm.template import swiglu_choices

    x, w_gate, w_up = (ir.ExternKernel.realize_input(node) for node in (x, w_gate, w_up))
    layout = ir.FixedLayout(x.get_device(), x.get_dtype(),
                            [x.get_size()[0], w_gate.get_size()[1]])
    choices: list[Any] = []
    swiglu_choices(choices, [x, w_gate, w_up], layout)
    return select_or_decompose("cutedsl_swiglu_mm", choices, swiglu_mm_aten,
                               [x, w_gate, w_up], layout,
                               lambda: _lower_decomposed(x, w_gate, w_up))


def select_or_decompose(name: str, choices: list[Any], fallback: Any, nodes: list[Any],
                        layout: Any, decomposed: Any) -> Any:
    """Our ``choices`` timed against the ATen ``fallback`` (an ``ExternKernelChoice`` on
    ``nodes``): the winner's node (retimed in rounds, ``retimed_winner``), or
    ``decomposed()`` -- the pattern as Inductor lowers it -- where there is no choice of
    ours or the fallback wins."""
    from torch._inductor import ir

    if not choices:
        return decomposed()
    choices.insert(0, fallback.bind(nodes, layout))
    # Chosen now, not deferred to the scheduler, so that a fallback win can be re-lowered.
    with recording_timings() as record:
        node = autotune_select_algorithm(name, choices, nodes, layout,
                                         return_multi_template=False)
    if isinstance(getattr(node.data, "data", None), ir.ExternKernel):
        # Unused, the fallback's node is dropped by the scheduler's dead-code elimination.
        log.debug("%s: the ATen fallback won; lowering the pattern as Inductor would", name)
        return decomposed()
    retimed = retimed_winner(record.timings)
    # Unused, the first winner's node is dropped like the fallback's.
    return retimed.output_node() if retimed is not None else node


def retimed_winner(timings: dict[Any, float]) -> Any:
    """Where our choice won, the fastest of our ``config.fused_choice_candidates`` fastest
    choices timed again in interleaved rounds (``autotune/retime.py``), if it is not the
    winner; else None (also where that retiming fails: the winner stays)."""
    ours = sorted((c for c, ms in timings.items()
                   if isinstance(c, CuteDSLTemplateCaller) and math.isfinite(ms)),
                  key=timings.__getitem__)
    candidates = ours[:config.fused_choice_candidates]
    if len(candidates) < 2 or not torch.cuda.is_available():
        return None
    try:
        best_binary, medians = fastest_in_rounds(*choice_calls(candidates))
    except Exception as err:  # keep the winner, never a crash
        log.warning("SwiGLU: kept %s, not retimed: %s", candidates[0].description, err)
        return None
    by_binary = {c.hash_key(): c for c in candidates}
    best = by_binary[best_binary]
    log.debug("SwiGLU retimed in rounds: %s; kept %s",
              {by_binary[b].description: round(ms, 4) for b, ms in medians.items()}
              or "as the earlier retiming of these configs", best.description)
    return best if best is not candidates[0] else None


def _lower_decomposed(x: Any, w_gate: Any, w_up: Any) -> Any:
    """The pattern as it was, through Inductor's lowerings (its mm autotuning included)."""
    from torch._inductor.lowering import lowerings as L

    return silu_times(L[aten.mm.default](x, w_gate), L[aten.mm.default](x, w_up))


def silu_times(gate: Any, up: Any) -> Any:
    """``silu(gate) * up`` through Inductor's lowerings, silu in fp32 and cast back to
    ``gate``'s dtype, as AOT autograd decomposes it."""
    from torch._inductor.lowering import lowerings as L

    dtype = gate.get_dtype()
    gate = L[prims.convert_element_type.default](gate, torch.float32)
    one_plus = L[aten.add.Tensor](L[aten.exp.default](L[aten.neg.default](gate)), 1)
    silu = L[prims.convert_element_type.default](L[aten.div.Tensor](gate, one_plus), dtype)
    return L[aten.mul.Tensor](silu, up)
