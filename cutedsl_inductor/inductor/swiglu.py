"""SwiGLU as one GEMM: ``silu(x @ w_gate) * (x @ w_up)`` in a single kernel.

Fusing the multiply into the second GEMM's epilogue still writes ``silu(x @ w_gate)``
to memory and reads it back, and runs two kernels. ``SwiGLUPass``, the CUDA backend's
post-grad pass (Inductor's ``custom_backend_passes["cuda"]``, run on graphs with a CUDA
tensor; installed by ``install()``, keyed by ``cache_key.fingerprint``), replaces
the pattern with the custom op ``cutedsl::swiglu_mm(x, w_gate, w_up)``, whose lowering
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

The pattern, as AOT autograd leaves it: ``mul(convert(silu(convert(mm(x, w_gate)))),
mm(x, w_up))`` with silu decomposed (``c / (1 + exp(-c))`` or ``c * sigmoid(c)``), the
conversions optional, either factor first, each mm possibly behind reshapes (a 3-D
``x`` flattened, once per mm). It is rewritten only where it is safe and can pay:

* ``config.epilogue_fusion`` is on and CUTEDSL is a max-autotune GEMM backend;
* x and the weights are 2-D bf16/fp16 CUDA tensors of one dtype and the target is
  sm_90, and both mms read the same x (the same node or equal reshapes of one node);
* every intermediate is used by the pattern alone (a value that autograd saves, or any
  other consumer, keeps the graph as it was).

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
from torch._inductor.custom_graph_pass import CustomGraphModulePass
from torch._inductor.select_algorithm import ExternKernelChoice

from .. import config
from ..autotune.retime import choice_calls, fastest_in_rounds, recording_timings
from ..autotune.select import autotune_select_algorithm
from ..compile.compiler import target_arch
from ..template.caller import CuteDSLTemplateCaller
from .cache_key import cutedsl_gemm_enabled, fingerprint

log = logging.getLogger(__name__)

aten, prims = torch.ops.aten, torch.ops.prims
_VIEWS = (aten.reshape.default, aten.view.default)


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
    if not choices:
        return _lower_decomposed(x, w_gate, w_up)
    choices.insert(0, swiglu_mm_aten.bind([x, w_gate, w_up], layout))
    # Chosen now, not deferred to the scheduler, so that a fallback win can be re-lowered.
    with recording_timings() as record:
        node = autotune_select_algorithm("cutedsl_swiglu_mm", choices, [x, w_gate, w_up],
                                         layout, return_multi_template=False)
    if isinstance(getattr(node.data, "data", None), ir.ExternKernel):
        # Unused, the fallback's node is dropped by the scheduler's dead-code elimination.
        log.debug("SwiGLU: the ATen fallback won; lowering the pattern as Inductor would")
        return _lower_decomposed(x, w_gate, w_up)
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

    gate = L[prims.convert_element_type.default](L[aten.mm.default](x, w_gate), torch.float32)
    one_plus = L[aten.add.Tensor](L[aten.exp.default](L[aten.neg.default](gate)), 1)
    silu = L[prims.convert_element_type.default](L[aten.div.Tensor](gate, one_plus),
                                                 x.get_dtype())
    return L[aten.mul.Tensor](silu, L[aten.mm.default](x, w_up))


# ------------------------------------------------------------------ graph rewrite
def _strip(node: Any, targets: tuple[Any, ...], matched: list[Any]) -> Any:
    """Follow ``node`` through calls of ``targets`` (recorded in ``matched``)."""
    while isinstance(node, torch.fx.Node) and node.target in targets:
        matched.append(node)
        node = node.args[0]
    return node


def _call(node: Any, target: Any) -> bool:
    return isinstance(node, torch.fx.Node) and node.target == target


def _silu_input(node: Any, matched: list[Any]) -> Any:
    """c where ``node`` is silu(c), decomposed or not (the nodes recorded), else None."""
    if _call(node, aten.silu.default):
        matched.append(node)
        return node.args[0]
    if _call(node, aten.mul.Tensor) and _call(node.args[1], aten.sigmoid.default):
        c = node.args[0]
        if node.args[1].args[0] is c:
            matched += [node, node.args[1]]
            return c
    if _call(node, aten.div.Tensor) and _call(node.args[1], aten.add.Tensor):
        c, add = node.args
        exp = add.args[0]
        if (add.args[1] == 1 and _call(exp, aten.exp.default)
                and _call(exp.args[0], aten.neg.default) and exp.args[0].args[0] is c):
            matched += [node, add, exp, exp.args[0]]
            return c
    return None


def _same_input(a: Any, b: Any) -> bool:
    if a is b:
        return True
    return (isinstance(a, torch.fx.Node) and a.target in _VIEWS and b.target == a.target
            and b.args[0] is a.args[0] and list(b.args[1]) == list(a.args[1]))


def _match(mul: Any) -> tuple[Any, Any] | None:
    """(the gate mm, the up mm) of a SwiGLU ``mul`` whose intermediates nothing else
    uses, else None."""
    for gate_side, up_side in ((mul.args[0], mul.args[1]), (mul.args[1], mul.args[0])):
        matched = [mul]
        up = _strip(up_side, _VIEWS, matched)
        c = _silu_input(_strip(gate_side, (prims.convert_element_type.default,), matched),
                        matched)
        gate = _strip(_strip(c, (prims.convert_element_type.default,), matched), _VIEWS,
                      matched)
        if not (_call(gate, aten.mm.default) and _call(up, aten.mm.default)):
            continue
        matched += [gate, up]
        if not _same_input(gate.args[0], up.args[0]):
            continue
        inside = set(matched)
        if all(set(node.users) <= inside for node in matched if node is not mul):
            return gate, up
    return None


def _suits(gate: Any, up: Any, out: Any) -> bool:
    values = [gate.args[0].meta.get("val"), gate.args[1].meta.get("val"),
              up.args[1].meta.get("val")]
    if any(v is None for v in values) or out.meta.get("val") is None:
        return False
    dtype = values[0].dtype
    return (target_arch().startswith("sm_90") and dtype in (torch.bfloat16, torch.float16)
            and all(v.dtype == dtype and v.dim() == 2 and v.device.type == "cuda"
                    for v in values) and out.meta["val"].dtype == dtype)


def rewrite_swiglu(graph: torch.fx.Graph) -> int:
    """Replace every suitable SwiGLU pattern in ``graph``; returns how many."""
    rewritten = 0
    for mul in [n for n in graph.nodes if _call(n, aten.mul.Tensor)]:
        found = _match(mul)
        if found is None or not _suits(*found, mul):
            continue
        gate, up = found
        x, w_gate, w_up = gate.args[0], gate.args[1], up.args[1]
        with graph.inserting_before(mul):
            fused = graph.call_function(torch.ops.cutedsl.swiglu_mm.default, (x, w_gate, w_up))
            fused.meta["val"] = torch.ops.cutedsl.swiglu_mm.default(
                x.meta["val"], w_gate.meta["val"], w_up.meta["val"])
            result = fused
            # the mm's result reshaped as the up factor was (its sizes: nodes where dynamic)
            up_factor = mul.args[1] if _strip(mul.args[1], _VIEWS, []) is up else mul.args[0]
            if up_factor is not up:
                result = graph.call_function(up_factor.target, (fused, *up_factor.args[1:]))
                result.meta["val"] = mul.meta["val"]
        mul.replace_all_uses_with(result)
        rewritten += 1
    if rewritten:
        graph.eliminate_dead_code()
        log.debug("SwiGLU: %d pattern(s) rewritten to cutedsl::swiglu_mm", rewritten)
    return rewritten


class SwiGLUPass(CustomGraphModulePass):
    """``rewrite_swiglu`` where enabled, then the pass that was installed before ours."""

    def __init__(self, previous: CustomGraphModulePass | None = None) -> None:
        self.previous = previous

    def __call__(self, gm: torch.fx.GraphModule) -> None:
        if config.epilogue_fusion and cutedsl_gemm_enabled():
            rewrite_swiglu(gm.graph)
        if self.previous is not None:
            self.previous(gm)

    def uuid(self) -> Any:
        return fingerprint("SwiGLUPass", self.previous.uuid() if self.previous else None)


def install_swiglu() -> None:
    """Install ``SwiGLUPass`` and the lowering of ``cutedsl::swiglu_mm`` (idempotent)."""
    from torch._inductor.codegen import common
    from torch._inductor.lowering import lowerings, register_lowering

    current = common.custom_backend_passes.get("cuda")
    if not isinstance(current, SwiGLUPass):
        common.custom_backend_passes["cuda"] = SwiGLUPass(current)
    if torch.ops.cutedsl.swiglu_mm.default not in lowerings:
        register_lowering(torch.ops.cutedsl.swiglu_mm.default)(lower_swiglu_mm)
