"""The FP8 GEMM's choices for ``torch._scaled_mm`` (``Sm90ScaledGemm``, ``scaled.py``), in
the lowering of ``aten._scaled_mm.default`` (``inductor/scaled_mm.py``).

``scaled_mm_choices(choices, nodes, layout, use_fast_accum)`` takes Inductor's input
nodes in its order, ``[a, b, scale_a, scale_b]`` and the bias if there is one, and
appends one choice per config of ``fp8_configs`` (``config.gemm_max_configs``; every one
with ``config.gemm_exhaustive``), the template's ``SCALE_A`` / ``SCALE_B`` saying each
scale's kind. It returns None, or why the problem gets no choice (also logged at debug):

* the checks of the bf16 GEMM's (``template.operand_problem``: sm_90, CUDA, aligned,
  runtime strides known to be 16-byte multiples) and ``GemmProblem.why_not``'s: FP8
  operands, K-major both (A row-major, B column-major: what ``_scaled_mm`` takes; FP8
  WGMMA reads nothing else), a bf16, fp16 or fp32 output;
* scales other than fp32 tensorwise (one element: every size 1, rank 0 included) or
  rowwise (A's ``(M, 1)``, B's ``(1, N)``), e.g. the blockwise MX recipes' (a mix is
  taken: either scale's kind is its own);
* a bias other than a vector of N values;
* ``use_fast_accum=False``: the kernel accumulates in the WGMMA accumulator throughout
  (``scaled.py``), which is what fast accumulation means.

Dynamic M: sizes and strides are symbolic as in every GEMM choice, a rowwise scale's M
the output's.

``scaled_swiglu_choices(choices, nodes, layout)`` appends the FP8 SwiGLU's
(``fp8_swiglu_configs``; the lowering of ``cutedsl::scaled_swiglu_mm``,
``inductor/scaled_swiglu.py``): x's scale and each weight's, every one tensorwise or
rowwise on its own.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from .heuristic import fp8_configs, fp8_swiglu_configs
from .template import append_choices, operand_problem, ranked_configs

log = logging.getLogger(__name__)

__all__ = ["scaled_mm_choices", "scaled_swiglu_choices", "scale_kind"]


def _all_one(sizes: list[Any]) -> bool:
    from torch._inductor.virtualized import V

    return all(V.graph.sizevars.statically_known_equals(s, 1) for s in sizes)


def scale_kind(node: Any, side: str, m: Any, n: Any) -> str | None:
    """The kind of ``_scaled_mm``'s scale ``node`` of operand ``side`` ("a" or "b") of an
    (m, n) output: "tensor" (one value), "row" (A's, one per row), "col" (B's, one per
    column), or None (another recipe: the kernel takes none)."""
    from torch._inductor.virtualized import V

    size = list(node.get_size())
    if node.get_dtype() != torch.float32:
        return None
    if _all_one(size):
        return "tensor"
    if len(size) != 2:
        return None
    equals = V.graph.sizevars.statically_known_equals
    if side == "a" and equals(size[0], m) and _all_one(size[1:]):
        return "row"
    if side == "b" and _all_one(size[:1]) and equals(size[1], n):
        return "col"
    return None


def _why_not_scales(scales: dict[str, tuple[Any, str]], m: Any, n: Any) -> str | None:
    """Why a scale (name -> (node, side)) is of no kind the kernel takes, else None."""
    for name, (node, side) in scales.items():
        if scale_kind(node, side, m, n) is None:
            return (f"{name} {node.get_dtype()}{list(node.get_size())} is neither an fp32 "
                    "tensorwise scale nor a rowwise one")
    return None


def _why_not_scaled(nodes: list[Any], layout: Any, use_fast_accum: bool) -> str | None:
    """Why the scales, the bias or the accumulation rule out the kernel, else None."""
    from torch._inductor.virtualized import V

    if not use_fast_accum:
        return ("use_fast_accum=False asks for periodic promotion into an fp32 "
                "accumulator, which the kernel does not do")
    m, n = layout.size[-2], layout.size[-1]
    reason = _why_not_scales({"scale_a": (nodes[2], "a"), "scale_b": (nodes[3], "b")}, m, n)
    if reason is None and len(nodes) > 4:
        bias = nodes[4]
        size = list(bias.get_size())
        if len(size) != 1 or not V.graph.sizevars.statically_known_equals(size[0], n):
            return f"bias of size {size} is not a vector of N={n} values"
    return reason


def scaled_mm_choices(choices: list[Any], nodes: list[Any], layout: Any,
                      use_fast_accum: bool) -> str | None:
    """Append the FP8 kernel's choices for ``_scaled_mm`` (see the module docstring);
    returns None, or the reason there are none."""
    reason = _why_not_scaled(nodes, layout, use_fast_accum)
    if reason is None:
        problem, reason = operand_problem(nodes[0], nodes[1], layout, same_dtype=False)
    if reason is None and len(nodes) > 4:
        problem = problem.replace(bias_dtype=nodes[4].get_dtype())
        reason = problem.why_not()
    if reason is not None:
        log.debug("no CuteDSL scaled_mm choice: %s", reason)
        return reason
    m, n = layout.size[-2], layout.size[-1]
    scales = (scale_kind(nodes[2], "a", m, n), scale_kind(nodes[3], "b", m, n))
    configs = ranked_configs(fp8_configs, problem, layout)
    # the bias (if any) added as it is: beta 1
    append_choices(choices, nodes, layout, [problem], configs, has_bias=len(nodes) > 4,
                   alpha=1.0, beta=1.0, scales=scales)
    return None


def scaled_swiglu_choices(choices: list[Any], nodes: list[Any], layout: Any) -> str | None:
    """Append the FP8 SwiGLU's choices (``silu(x @ w_gate) * (x @ w_up)``, each product
    scaled as ``_scaled_mm`` scales it; ``nodes`` = [x, w_gate, w_up, scale_x,
    scale_gate, scale_up], the weights (K, N) column-major); returns None, or why there
    are none: the checks of ``scaled_mm_choices`` for x with either weight, and two
    weights of one dtype."""
    x, w_gate, w_up, scale_x, scale_gate, scale_up = nodes
    m, n = layout.size[-2], layout.size[-1]
    reason = _why_not_scales({"scale_x": (scale_x, "a"), "scale_gate": (scale_gate, "b"),
                              "scale_up": (scale_up, "b")}, m, n)
    if reason is None:
        problem, reason = operand_problem(x, w_gate, layout, same_dtype=False)
    if reason is None:
        up_problem, reason = operand_problem(x, w_up, layout, same_dtype=False)
    if reason is None and w_gate.get_dtype() != w_up.get_dtype():
        reason = f"the weights differ in dtype ({w_gate.get_dtype()}, {w_up.get_dtype()})"
    if reason is not None:
        log.debug("no CuteDSL FP8 SwiGLU choice: %s", reason)
        return reason
    scales = tuple(scale_kind(node, side, m, n)
                   for node, side in ((scale_x, "a"), (scale_gate, "b"), (scale_up, "b")))
    configs = ranked_configs(fp8_swiglu_configs, problem, layout)
    append_choices(choices, nodes, layout, [problem, up_problem], configs, scales=scales)
    return None
