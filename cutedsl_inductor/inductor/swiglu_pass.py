"""The SwiGLU rewrite: ``SwiGLUPass``, the CUDA backend's post-grad pass (Inductor's
``custom_backend_passes["cuda"]``, run on graphs with a CUDA tensor; installed by
``install()``, keyed by ``cache_key.fingerprint``), replaces the pattern with
``cutedsl::swiglu_mm`` (``swiglu.py``) or, for two FP8 GEMMs, ``cutedsl::scaled_swiglu_mm``
(``scaled_swiglu.py``).

The pattern, as AOT autograd leaves it: ``mul(convert(silu(convert(mm(x, w_gate)))),
mm(x, w_up))`` with silu decomposed (``c / (1 + exp(-c))`` or ``c * sigmoid(c)``), the
conversions optional, either factor first, each mm possibly behind reshapes (a 3-D
``x`` flattened, once per mm). It is rewritten only where it is safe and can pay:

* ``config.epilogue_fusion`` is on and CUTEDSL is a max-autotune GEMM backend;
* x and the weights are 2-D bf16/fp16 CUDA tensors of one dtype and the target is
  sm_90, and both mms read the same x (the same node or equal reshapes of one node);
* every intermediate is used by the pattern alone (a value that autograd saves, or any
  other consumer, keeps the graph as it was: a training graph's, logged at debug).

Two ``_scaled_mm`` (torchao's float8 Linears) are a pair with ``config.fp8_swiglu``: FP8
operands, an output of bf16, fp16 or fp32, fast accumulation, no bias or output scale,
and one x and x scale -- the same nodes, or equal quantizations of one x, proven node
by node (``scaled_swiglu.scaled_pair_error``); the op reads the gate's and the other
quantization, unused then, is dropped with the dead code.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch._inductor.custom_graph_pass import CustomGraphModulePass

from .. import config
from ..compile.compiler import target_arch
from .cache_key import cutedsl_gemm_enabled, fingerprint
from .fx_nodes import bound
from .scaled_swiglu import lower_scaled_swiglu_mm, scaled_pair_error
from .swiglu import lower_swiglu_mm

log = logging.getLogger(__name__)

aten, prims = torch.ops.aten, torch.ops.prims
_VIEWS = (aten.reshape.default, aten.view.default)
# the FP8 GEMM's operands (``kernels/gemm/config.FP8_DTYPES``, not imported: a warm
# process imports none of the kernels' modules)
_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


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


def _pair_error(gate: Any, up: Any) -> str | None:
    """Why two GEMMs of the pattern (both mm, or both ``_scaled_mm``) are no SwiGLU
    pair of one activation, or None."""
    if gate.target == aten.mm.default:
        return None if _same_input(gate.args[0], up.args[0]) else "the two mms read other xs"
    return scaled_pair_error(gate, up)


def _match(mul: Any, fp8: bool) -> tuple[Any, Any] | None:
    """(the gate GEMM, the up GEMM) of a SwiGLU ``mul`` whose intermediates nothing else
    uses, else None (where both factors are GEMMs, with the reason at debug); ``fp8``:
    pairs of ``_scaled_mm`` too."""
    gemms = (aten.mm.default, aten._scaled_mm.default) if fp8 else (aten.mm.default,)
    for gate_side, up_side in ((mul.args[0], mul.args[1]), (mul.args[1], mul.args[0])):
        matched = [mul]
        up = _strip(up_side, _VIEWS, matched)
        c = _silu_input(_strip(gate_side, (prims.convert_element_type.default,), matched),
                        matched)
        gate = _strip(_strip(c, (prims.convert_element_type.default,), matched), _VIEWS,
                      matched)
        if not (isinstance(gate, torch.fx.Node) and isinstance(up, torch.fx.Node)
                and gate.target == up.target and gate.target in gemms):
            continue
        matched += [gate, up]
        reason = _pair_error(gate, up)
        inside = set(matched)
        if reason is None and not all(set(node.users) <= inside
                                      for node in matched if node is not mul):
            reason = "an intermediate has a use outside the pattern (saved for the backward?)"
        if reason is None:
            return gate, up
        log.debug("SwiGLU: %s left as it is: %s", mul, reason)
    return None


def _suits(gate: Any, up: Any, out: Any) -> bool:
    """Whether the kernel's dtypes, ranks, device and arch hold (``_scaled_mm``: FP8
    operands, an output of the kernel's)."""
    values = [gate.args[0].meta.get("val"), gate.args[1].meta.get("val"),
              up.args[1].meta.get("val")]
    if any(v is None for v in values) or out.meta.get("val") is None:
        return False
    dtype = out.meta["val"].dtype
    operands, outputs = (dtype,), (torch.bfloat16, torch.float16)
    if gate.target == aten._scaled_mm.default:
        operands, outputs = _FP8, (torch.bfloat16, torch.float16, torch.float32)
    return (target_arch().startswith("sm_90") and dtype in outputs
            and all(v.dtype in operands and v.dim() == 2 and v.device.type == "cuda"
                    for v in values) and gate.meta["val"].dtype == dtype)


def _fused(graph: torch.fx.Graph, gate: Any, up: Any) -> Any:
    """The node of our op replacing the pair (inserted at the graph's insertion point)."""
    if gate.target == aten.mm.default:
        op, args = torch.ops.cutedsl.swiglu_mm.default, (*gate.args, up.args[1])
    else:
        gate_call, up_call = bound(gate), bound(up)
        op = torch.ops.cutedsl.scaled_swiglu_mm.default
        args = (gate_call["self"], gate_call["mat2"], up_call["mat2"], gate_call["scale_a"],
                gate_call["scale_b"], up_call["scale_b"], gate.meta["val"].dtype)
    fused = graph.call_function(op, args)
    fused.meta["val"] = op(*(a.meta["val"] if isinstance(a, torch.fx.Node) else a
                             for a in args))
    return fused


def rewrite_swiglu(graph: torch.fx.Graph, fp8: bool = False) -> int:
    """Replace every suitable SwiGLU pattern in ``graph`` (``fp8``: those of two
    ``_scaled_mm`` too); returns how many."""
    rewritten = 0
    for mul in [n for n in graph.nodes if _call(n, aten.mul.Tensor)]:
        found = _match(mul, fp8)
        if found is None or not _suits(*found, mul):
            continue
        gate, up = found
        with graph.inserting_before(mul):
            result = fused = _fused(graph, gate, up)
            # the GEMM's result reshaped as the up factor was (its sizes: nodes where dynamic)
            up_factor = mul.args[1] if _strip(mul.args[1], _VIEWS, []) is up else mul.args[0]
            if up_factor is not up:
                result = graph.call_function(up_factor.target, (fused, *up_factor.args[1:]))
                result.meta["val"] = mul.meta["val"]
        mul.replace_all_uses_with(result)
        rewritten += 1
    if rewritten:
        graph.eliminate_dead_code()
        log.debug("SwiGLU: %d pattern(s) rewritten to one GEMM", rewritten)
    return rewritten


class SwiGLUPass(CustomGraphModulePass):
    """``rewrite_swiglu`` where enabled, then the pass that was installed before ours."""

    def __init__(self, previous: CustomGraphModulePass | None = None) -> None:
        self.previous = previous

    def __call__(self, gm: torch.fx.GraphModule) -> None:
        if config.epilogue_fusion and cutedsl_gemm_enabled():
            rewrite_swiglu(gm.graph, fp8=config.fp8_swiglu)
        if self.previous is not None:
            self.previous(gm)

    def uuid(self) -> Any:
        return fingerprint("SwiGLUPass", self.previous.uuid() if self.previous else None)


def install_swiglu() -> None:
    """Install ``SwiGLUPass`` and the lowerings of ``cutedsl::swiglu_mm`` and
    ``cutedsl::scaled_swiglu_mm`` (idempotent)."""
    from torch._inductor.codegen import common
    from torch._inductor.lowering import lowerings, register_lowering

    current = common.custom_backend_passes.get("cuda")
    if not isinstance(current, SwiGLUPass):
        common.custom_backend_passes["cuda"] = SwiGLUPass(current)
    if torch.ops.cutedsl.swiglu_mm.default not in lowerings:
        register_lowering(torch.ops.cutedsl.swiglu_mm.default)(lower_swiglu_mm)
    if torch.ops.cutedsl.scaled_swiglu_mm.default not in lowerings:
        # no type promotion: the fp32 scales stay fp32 next to FP8 operands
        register_lowering(torch.ops.cutedsl.scaled_swiglu_mm.default,
                          type_promotion_kind=None)(lower_scaled_swiglu_mm)
