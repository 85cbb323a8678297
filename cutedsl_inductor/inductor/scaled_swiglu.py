"""SwiGLU of two FP8 GEMMs as one kernel (``config.fp8_swiglu``, off until timed on the
GPU): ``silu(_scaled_mm(x, w_gate, sx, s_gate)) * _scaled_mm(x, w_up, sx, s_up)``, the
MLP of torchao's float8 Linears, becomes ``cutedsl::scaled_swiglu_mm(x, w_gate, w_up,
scale_x, scale_gate, scale_up, out_dtype)`` (the rewrite: ``swiglu_pass.py``).

The op's ATen form (its eager implementation and the lowering's fallback choice,
``cutedsl_scaled_swiglu_mm_aten``) is two ``_scaled_mm`` with fast accumulation -- the
only graphs rewritten ask for it -- and silu and the multiply in place, in ``out_dtype``
as the graph computes them. The lowering requires what ``_scaled_mm`` takes (x
row-major, each (K, N) weight column-major: K-major, the only layout FP8 WGMMA reads;
a weight quantized in the graph is laid out so instead of copied) and times the FP8
two-weight kernel's choices (``scaled_swiglu_choices``: each accumulator scaled by x's
scale and its own weight's, tensorwise or rowwise, before ``silu(gate) * up``) against
that fallback, as ``swiglu.select_or_decompose`` does for bf16.

The pair's x: torchao quantizes x once per Linear, two equal subgraphs (abs, amax or
max, a reciprocal or a division, a multiply, a clamp, the cast to e4m3) that AOT
autograd does not merge. ``same_value`` proves two nodes equal as values: the same node,
or calls of one functional, deterministic op on arguments proven equal in turn (nodes)
or equal as constants; inputs (placeholders, attributes) only as themselves. So a
quantization of another tensor, a random op or an in-place one is never equal.

Failure semantics: a pair that is no such pair (another x, a bias, an output scale, slow
accumulation) is not rewritten (the reason at debug, ``scaled_pair_error``); where the
lowering has no choice of ours, or the fallback wins, the pattern is lowered as it was
(two ``_scaled_mm`` through their own lowering, silu and the multiply).
"""

from __future__ import annotations

from typing import Any

import torch
from torch._inductor.select_algorithm import ExternKernelChoice

from .fx_nodes import bound
from .swiglu import select_or_decompose, silu_times

aten = torch.ops.aten


@torch.library.custom_op("cutedsl::scaled_swiglu_mm", mutates_args=())
def scaled_swiglu_mm(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor,
                     scale_x: torch.Tensor, scale_gate: torch.Tensor,
                     scale_up: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """``silu(_scaled_mm(x, w_gate)) * _scaled_mm(x, w_up)`` in ``out_dtype``: x (M, K)
    and the weights (K, N) FP8, the scales as ``_scaled_mm`` takes them."""
    out = x.new_empty((x.shape[0], w_gate.shape[1]), dtype=out_dtype)
    return scaled_swiglu_mm_out(x, w_gate, w_up, scale_x, scale_gate, scale_up, out=out)


@scaled_swiglu_mm.register_fake
def _(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, scale_x: torch.Tensor,
      scale_gate: torch.Tensor, scale_up: torch.Tensor, out_dtype: torch.dtype
      ) -> torch.Tensor:
    return x.new_empty((x.shape[0], w_gate.shape[1]), dtype=out_dtype)


def scaled_swiglu_mm_out(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor,
                         scale_x: torch.Tensor, scale_gate: torch.Tensor,
                         scale_up: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    torch._scaled_mm(x, w_gate, scale_x, scale_gate, out_dtype=out.dtype,
                     use_fast_accum=True, out=out)
    torch.nn.functional.silu(out, inplace=True)
    return out.mul_(torch._scaled_mm(x, w_up, scale_x, scale_up, out_dtype=out.dtype,
                                     use_fast_accum=True))


# made at import, so that cached output code that calls it finds it registered
scaled_swiglu_mm_aten = ExternKernelChoice(scaled_swiglu_mm_out,
                                           name="cutedsl_scaled_swiglu_mm_aten",
                                           has_out_variant=True)


def lower_scaled_swiglu_mm(x: Any, w_gate: Any, w_up: Any, scale_x: Any, scale_gate: Any,
                           scale_up: Any, out_dtype: torch.dtype) -> Any:
    """Inductor lowering of ``cutedsl::scaled_swiglu_mm`` (see the module docstring)."""
    from torch._inductor import ir

    # lazily: the kernel's modules import cutlass (slow, and optional until a GEMM runs)
    from ..kernels.gemm.scaled_choices import scaled_swiglu_choices

    def ordered(node: Any, order: list[int]) -> Any:
        return ir.ExternKernel.require_stride_order(ir.ExternKernel.realize_input(node),
                                                    order)

    x = ordered(x, [1, 0])
    w_gate, w_up = ordered(w_gate, [0, 1]), ordered(w_up, [0, 1])
    scales = [ir.ExternKernel.realize_input(s) for s in (scale_x, scale_gate, scale_up)]
    nodes = [x, w_gate, w_up, *scales]
    layout = ir.FixedLayout(x.get_device(), out_dtype, [x.get_size()[0], w_gate.get_size()[1]])
    choices: list[Any] = []
    scaled_swiglu_choices(choices, nodes, layout)
    return select_or_decompose("cutedsl_scaled_swiglu_mm", choices, scaled_swiglu_mm_aten,
                               nodes, layout, lambda: _lower_decomposed(*nodes, out_dtype))


def _lower_decomposed(x: Any, w_gate: Any, w_up: Any, scale_x: Any, scale_gate: Any,
                      scale_up: Any, out_dtype: torch.dtype) -> Any:
    """The pattern as it was, through Inductor's lowerings (``_scaled_mm``'s autotuning,
    ours among it with ``config.fp8``, included)."""
    from torch._inductor.lowering import lowerings as L

    scaled_mm = L[aten._scaled_mm.default]
    return silu_times(scaled_mm(x, w_gate, scale_x, scale_gate, None, None, out_dtype, True),
                      scaled_mm(x, w_up, scale_x, scale_up, None, None, out_dtype, True))


# ------------------------------------------------------------------ the pair in a graph
def scaled_pair_error(gate: torch.fx.Node, up: torch.fx.Node) -> str | None:
    """Why two ``_scaled_mm`` are no FP8 SwiGLU pair of one x, or None."""
    calls = [bound(gate), bound(up)]
    for call in calls:
        if call["bias"] is not None or call["scale_result"] is not None:
            return "a _scaled_mm with a bias or an output scale"
        if not call["use_fast_accum"]:
            return "a _scaled_mm without fast accumulation (the kernel's only one)"
    if calls[0]["out_dtype"] != calls[1]["out_dtype"]:
        return "the two _scaled_mm differ in output dtype"
    memo: dict[tuple[int, int], bool] = {}
    for name in ("self", "scale_a"):
        if not same_value(calls[0][name], calls[1][name], memo):
            return f"the two _scaled_mm's {name} are not proven one value"
    return None


def same_value(a: Any, b: Any, memo: dict[tuple[int, int], bool]) -> bool:
    """Whether ``a`` and ``b`` (nodes, constants or lists of them) are one value (the
    module docstring's rule); ``memo`` holds the node pairs already compared."""
    if a is b:
        return True
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_value(x, y, memo) for x, y in zip(a, b))
    if not (isinstance(a, torch.fx.Node) and isinstance(b, torch.fx.Node)):
        return (not isinstance(a, torch.fx.Node) and not isinstance(b, torch.fx.Node)
                and type(a) is type(b) and a == b)
    key = (id(a), id(b))
    if key not in memo:
        memo[key] = _same_call(a, b, memo)
    return memo[key]


def _same_call(a: torch.fx.Node, b: torch.fx.Node, memo: dict[tuple[int, int], bool]) -> bool:
    target = a.target
    if not (a.op == b.op == "call_function" and b.target == target
            and isinstance(target, torch._ops.OpOverload)):
        return False
    if target._schema.is_mutable or torch.Tag.nondeterministic_seeded in target.tags:
        return False
    return (same_value(a.args, b.args, memo) and a.kwargs.keys() == b.kwargs.keys()
            and all(same_value(a.kwargs[k], b.kwargs[k], memo) for k in a.kwargs))
