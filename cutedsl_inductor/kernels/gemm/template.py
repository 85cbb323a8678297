"""The Hopper GEMM as a CuteDSL template: choices for aten.mm, aten.addmm and aten.bmm.

The rendered module imports ``Sm90Gemm`` (``sm90_gemm.py``) and defines a ``@cute.jit``
entry that views torch's operands in the kernel's (M, K, L) / (N, K, L) / (M, N, L)
convention through their strides -- so transposed operands need no copy -- and calls
it. Every size and stride is symbolic (``symbolic_shapes=True``): one binary per
config, dtype, operand majorness and divisibility class serves every M, N, K.

``gemm_choices(op, nodes, layout, alpha, beta)`` checks that the problem suits the
kernel (sm_90 target, bf16/fp16 operands of one dtype, output in that dtype, unit
stride on one side of each operand, 16-byte aligned leading dimensions, aligned base
pointers) and appends one choice per config from the heuristic (``pick_configs``,
``config.gemm_max_configs``; every valid config with ``config.gemm_exhaustive``).
Under dynamic shapes a stride that is a runtime size must be known to be aligned: the
graph serves later sizes too, and the checks on this call's sizes say nothing of them.
A split-K config (small M, see ``pick_configs``) adds ``SPLIT_K`` to the parameters, one
with a raster band other than the default (``group_size``, config sweeps) ``GROUP_SIZE``, a
swap-AB config (M <= 32) ``SWAP_AB``: its entry passes the kernel (B, A, C^T), the
weight in the WGMMA's M mode, and the fused epilogue swaps the coordinates back.
A problem that does not suit it gets no choice, with a debug log saying why.
``swiglu_choices(nodes, layout)`` appends the two-weight configs (``SWIGLU``:
``silu(x @ w_gate) * (x @ w_up)``, the entry ``(a, b, b_up)``; the kernel's ``swiglu``
"b", or "a" with swap-AB, where the weights are its A) for the lowering of
``cutedsl::swiglu_mm`` (``inductor/swiglu.py``); with ``SCALE_A`` too, the FP8 SwiGLU's (entry
``(a, b, b_up, scale_a, scale_b, scale_up)``, ``scaled_choices.scaled_swiglu_choices``).
A fused epilogue's output may be float8 (``problem.fused_output_error``), then C's dtype.
A fused prologue (``{{def_prologue("a")}}``: the scheduler's, on torch's ``a``) renders the
kernel's ``transform_a`` variant, its A the prologue's source (``transform_a.py``); a
swap-AB, SwiGLU or split-K choice claims no prologue, so it is not fused there.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from ... import config
from ...compile.compiler import target_arch
from ...compile.records import Params
from ...compile.specs import is_aligned
from ...template.template import CuteDSLTemplate

# The rendered module imports the kernel: without a usable CuTe DSL this import fails
# and the template offers nothing (``inductor/choices.py``).
from . import sm90_gemm  # noqa: F401
from .config import DEFAULT_GROUP_SIZE, GemmConfig
from .heuristic import pick_configs, swiglu_configs
from .problem import GemmProblem, fused_output_error

log = logging.getLogger(__name__)

GEMM_SOURCE = r'''
from cutedsl_inductor.kernels.gemm.sm90_gemm import Sm90Gemm
from cutedsl_inductor.kernels.gemm.views import as_mkl, as_nkl_from_kn, as_mnl, as_nml
{#- _scaled_mm (scaled_choices.py): FP8 operands, scales in the epilogue; its own inputs
    come after the scales in epi_args, and its bias is a vector (broadcast_mnl). #}
{%- set scaled = SCALE_A is defined %}
{%- set base = "Sm90ScaledGemm" if scaled else "Sm90Gemm" %}
{%- set own_args = "epi_args[1]" if scaled else "epi_args" %}
{%- if scaled %}
from cutedsl_inductor.kernels.gemm.scaled import Sm90ScaledGemm
from cutedsl_inductor.kernels.gemm.views import broadcast_mnl
{%- endif %}
{#- Swap-AB runs C^T = B A^T: the kernel's (m, n) are torch's (n, m). #}
{%- if SWAP_AB is defined %}
{%- set kernel_a, kernel_b, view_c = "as_nkl_from_kn(b)", "as_mkl(a)", "as_nml" %}
{%- set up_weight = "mA_up=as_nkl_from_kn(b_up)" %}
{%- set row, col = "min(mn[1], prob_n - 1)", "min(mn[0], prob_m - 1)" %}
{%- else %}
{%- set kernel_a, kernel_b, view_c = "as_mkl(a)", "as_nkl_from_kn(b)", "as_mnl" %}
{%- set up_weight = "mB_up=as_nkl_from_kn(b_up)" %}
{%- set row, col = "min(mn[0], prob_m - 1)", "min(mn[1], prob_n - 1)" %}
{%- endif %}

{#- An epilogue input laid out like the output (a residual) comes by TMA into the store
    buffers, a sub-tile at a time, where the TMA store runs. #}
{%- set tile_input = has_epilogue and tile_input_index is not none and STORE == "tma"
    and SPLIT_K is not defined %}

{#- A fused prologue transforms the activation (torch's a, the kernel's A) as it is
    loaded: the transform_a variant, which takes neither swap-AB, SwiGLU nor split-K. #}
{%- set transform_a = has_prologue and SWAP_AB is not defined and SWIGLU is not defined
    and SPLIT_K is not defined and not scaled %}

{{gen_defines()}}
{%- if transform_a %}

{{def_prologue("a")}}
{%- endif %}
{%- if has_epilogue %}

{{def_epilogue(tile_input=tile_input)}}
{%- endif %}
{%- if has_epilogue or transform_a %}

class {{kernel_name}}_Gemm({{base}}):
{%- endif %}
{%- if transform_a %}
    @cute.jit
    def prologue_op(self, value, m, k, l_idx, pro_args):
        return {{kernel_name}}_prologue(value, {% if output_rank == 3 %}l_idx, {% endif %}m, k,
                                        pro_args)
{%- endif %}
{%- if has_epilogue %}
    # Tail-tile values are computed at the nearest valid coordinate (their loads stay in
    # bounds) and then dropped by the store: no branches, loads the compiler can share.
    @cute.jit
    def epilogue_prefetch(self, coords, l_idx, prob_m, prob_n, mBias, epi_args):
        loaded = {{kernel_name}}_epilogue_registers(cute.size(coords))
        if cutlass.const_expr(self.store == "tma"):
            # Values 2j and 2j + 1 sit in adjacent columns (the accumulator's layout) and
            # N is a multiple of 4 here: one load per pair, its column clamped to N - 2.
            for j in cutlass.range(cute.size(coords) // 2, unroll_full=True):
                mn = coords[2 * j]
                {{kernel_name}}_epilogue_load_pair(
                    loaded, 2 * j, {% if output_rank == 3 %}l_idx, {% endif %}
                    min(mn[0], prob_m - 1), min(mn[1], prob_n - 2), {{own_args}})
        else:
            for i in cutlass.range(cute.size(coords), unroll_full=True):
                mn = coords[i]
                {{kernel_name}}_epilogue_load(
                    loaded, i, {% if output_rank == 3 %}l_idx, {% endif %}{{row}}, {{col}},
                    {{own_args}})
        return ({{base}}.epilogue_prefetch(self, coords, l_idx, prob_m, prob_n, mBias, epi_args),
                loaded)

    @cute.jit
    def epilogue_op(self, acc, coords, l_idx, prob_m, prob_n, mBias, alpha, beta, epi_args,
                    prefetched):
        {{base}}.epilogue_op(self, acc, coords, l_idx, prob_m, prob_n, mBias, alpha, beta,
                             epi_args, prefetched[0])
        for i in cutlass.range(cute.size(acc), unroll_full=True):
            mn = coords[i]
            acc[i] = {{kernel_name}}_epilogue_apply(
                acc[i], prefetched[1], i, {% if output_rank == 3 %}l_idx, {% endif %}
                {{row}}, {{col}}, {{own_args}})
{%- if scaled and SWIGLU is defined %}

    @cute.jit
    def epilogue_values(self, frag, acc, acc_up, start, released, prefetched):
        {{base}}.epilogue_values(self, frag, acc, acc_up, start, released, prefetched[0])
{%- endif %}
{%- if tile_input %}

    @cute.jit
    def epilogue_tile_input(self, prefetched, values):
        for i in cutlass.range(cute.size(values), unroll_full=True):
            prefetched[1][{{tile_input_index}}][i] = values[i]
        return prefetched
{%- endif %}
{%- endif %}

@cute.jit
{% if scaled and SWIGLU is defined %}{{def_kernel("a", "b", "b_up", "scale_a", "scale_b", "scale_up")}}{% elif scaled %}{{def_kernel("a", "b", "scale_a", "scale_b", "bias") if HAS_BIAS else def_kernel("a", "b", "scale_a", "scale_b")}}{% elif HAS_BIAS %}{{def_kernel("bias", "a", "b")}}{% elif SWIGLU is defined %}{{def_kernel("a", "b", "b_up")}}{% else %}{{def_kernel("a", "b")}}{% endif %}
    gemm = {% if has_epilogue or transform_a %}{{kernel_name}}_Gemm{% else %}{{base}}{% endif %}(
        tile_m=TILE_M, tile_n=TILE_N, tile_k=TILE_K, cluster_m=CLUSTER_M,
        cluster_n=CLUSTER_N, stages=STAGES, raster=RASTER, cooperative=COOPERATIVE,
        pingpong=PINGPONG, store=STORE,{% if SPLIT_K is defined %} split_k=SPLIT_K,{% endif %}
        {%- if GROUP_SIZE is defined %} group_size=GROUP_SIZE,{% endif %}
        {%- if SWIGLU is defined %} swiglu=SWIGLU,{% endif %}
        {%- if transform_a %} transform_a=True,{% endif %}
        {%- if FP8 is defined %} fp8=FP8,{% endif %}
        {%- if PDL is defined %} pdl=PDL,{% endif %}
    )
    out = {{get_output()}}
{%- if scaled %}
{#- each (torch's dim along the kernel's M, along its N), or None: broadcast #}
{%- set a_dims = (None, None) if SCALE_A == "tensor" else ((None, 0) if SWAP_AB is defined else (0, None)) %}
{%- set b_dims = (None, None) if SCALE_B == "tensor" else ((1, None) if SWAP_AB is defined else (None, 1)) %}
{%- set bias_dims = (0, None) if SWAP_AB is defined else (None, 0) %}
{%- if SWIGLU is defined %}
{%- set up_dims = (None, None) if SCALE_UP == "tensor" else ((1, None) if SWAP_AB is defined else (None, 1)) %}
{%- endif %}
    mA, mB = {{kernel_a}}, {{kernel_b}}
    prob_m, prob_n = cute.size(mA, mode=[0]), cute.size(mB, mode=[0])
    scales = (broadcast_mnl(scale_a, prob_m, prob_n, {{a_dims[0]}}, {{a_dims[1]}}),
              broadcast_mnl(scale_b, prob_m, prob_n, {{b_dims[0]}}, {{b_dims[1]}}){% if SWIGLU is defined %},
              broadcast_mnl(scale_up, prob_m, prob_n, {{up_dims[0]}}, {{up_dims[1]}}){% endif %})
    {% if HAS_BIAS %}bias_view = broadcast_mnl(bias, prob_m, prob_n, {{bias_dims[0]}}, {{bias_dims[1]}}){% else %}bias_view = None{% endif %}
    gemm.launch(mA, mB, {{view_c}}(out), bias_view, ALPHA, BETA, stream,
                epi_args=(scales, {% if has_epilogue %}{{epilogue_inputs()}}{% else %}None{% endif %}),
                {%- if tile_input %} mTile={{view_c}}({{epilogue_tile_input()}}),{% endif %}
                {%- if SWIGLU is defined %} {{up_weight}},{% endif %})
{%- else %}
    {% if HAS_BIAS %}bias_view = {{view_c}}(bias){% else %}bias_view = None{% endif %}
{%- endif %}
{%- if scaled %}
{%- elif has_epilogue or SWIGLU is defined or transform_a %}
    gemm.launch({{kernel_a}}, {{kernel_b}}, {{view_c}}(out), bias_view,
                ALPHA, BETA, stream,
                {%- if has_epilogue %} epi_args={{epilogue_inputs()}},{% endif %}
                {%- if tile_input %} mTile={{view_c}}({{epilogue_tile_input()}}),{% endif %}
                {%- if SWIGLU is defined %} {{up_weight}},{% endif %}
                {%- if transform_a %} pro_args={{prologue_inputs()}},{% endif %})
{%- else %}
    gemm({{kernel_a}}, {{kernel_b}}, {{view_c}}(out), bias_view,
         ALPHA, BETA, stream)
{%- endif %}
'''

gemm_template = CuteDSLTemplate("sm90_gemm", GEMM_SOURCE, symbolic_shapes=True,
                                fused_output_error=fused_output_error)


def _params(cfg: GemmConfig, has_bias: bool, alpha: float, beta: float,
            scales: tuple[str, ...] | None = None) -> Params:
    """The template's parameters for ``cfg``; ``scales``: ``_scaled_mm``'s (A's, B's)
    kinds, "tensor" or "row" / "col", and the FP8 SwiGLU's up weight's third
    (``scaled_choices.py``)."""
    params = {
        "TILE_M": cfg.tile_m, "TILE_N": cfg.tile_n, "TILE_K": cfg.tile_k,
        "CLUSTER_M": cfg.cluster_m, "CLUSTER_N": cfg.cluster_n,
        "STAGES": cfg.stages, "RASTER": cfg.raster,
        "COOPERATIVE": cfg.cooperative, "PINGPONG": cfg.pingpong,
        "STORE": cfg.store,
        "HAS_BIAS": has_bias, "ALPHA": float(alpha), "BETA": float(beta),
    }
    # Only where set: the source (and cache key) of other choices stays as it was.
    if cfg.split_k > 1:
        params["SPLIT_K"] = cfg.split_k
    if cfg.group_size != DEFAULT_GROUP_SIZE:
        params["GROUP_SIZE"] = cfg.group_size
    if cfg.swap_ab:
        params["SWAP_AB"] = True
    if cfg.swiglu:
        params["SWIGLU"] = cfg.swiglu
    if cfg.fp8:
        params["FP8"] = True
    if scales is not None:
        params["SCALE_A"], params["SCALE_B"] = scales[:2]
        if len(scales) == 3:
            params["SCALE_UP"] = scales[2]
    if cfg.pdl:
        params["PDL"] = True
    return Params.of(params)


def _operand_layout(node: Any, unit_last: str, unit_second: str) -> tuple[str | None, Any]:
    """(the kernel's major mode, leading stride) of a matrix operand, by which of its
    last two dims has unit stride; (None, None) when neither has."""
    stride = node.get_stride()
    if stride[-1] == 1:
        return unit_last, stride[-2]
    if stride[-2] == 1:
        return unit_second, stride[-1]
    return None, None


def _is_runtime(expr: Any) -> bool:
    return bool(getattr(expr, "free_symbols", None))


def gemm_problem(nodes: list[Any], layout: Any) -> tuple[GemmProblem | None, str | None]:
    """(the problem, None) for a problem the kernel can run, else (None, the reason):
    torch's a and b the last two of ``nodes``, the output in their dtype."""
    return operand_problem(nodes[-2], nodes[-1], layout, same_dtype=True)


def operand_problem(a: Any, b: Any, layout: Any, same_dtype: bool
                    ) -> tuple[GemmProblem | None, str | None]:
    """``gemm_problem`` of torch's ``a @ b`` into ``layout``, whose dtype is the operands'
    where ``same_dtype``."""
    from torch._inductor.virtualized import V

    if not target_arch().startswith("sm_90"):
        return None, f"target {target_arch()} is not sm_90"
    if a.get_device().type != "cuda":
        return None, "not a CUDA tensor"
    if same_dtype and layout.dtype != a.get_dtype():
        return None, f"output dtype {layout.dtype} differs from operand dtype {a.get_dtype()}"
    if not (is_aligned(a) and is_aligned(b)):  # TMA's; a bias is read by plain loads
        return None, "an operand may not be 16-byte aligned"
    a_major, lda = _operand_layout(a, "k", "m")
    b_major, ldb = _operand_layout(b, "n", "k")
    if a_major is None or b_major is None:
        return None, "an operand has no unit-stride dimension"
    *batch, m, k = a.get_size()
    strides = [lda, ldb, layout.stride[-2]]
    if batch:
        strides += [a.get_stride()[0], b.get_stride()[0], layout.stride[0]]
    unit = 16 // a.get_dtype().itemsize
    for stride in strides:  # checked below on the hints, which a later call may not share
        if _is_runtime(stride) and not V.graph.sizevars.statically_known_multiple_of(stride,
                                                                                    unit):
            return None, (f"stride {stride} is a runtime size not known to be a multiple "
                          f"of {unit} elements (16 bytes, as TMA needs)")
    hint = V.graph.sizevars.optimization_hint
    problem = GemmProblem(
        a_dtype=a.get_dtype(), b_dtype=b.get_dtype(), out_dtype=layout.dtype,
        a_major=a_major, b_major=b_major, m=hint(m), n=hint(b.get_size()[-1]), k=hint(k),
        l=hint(batch[0]) if batch else 1, lda=hint(lda), ldb=hint(ldb),
        ldc=hint(layout.stride[-2]),
        batch_strides=tuple(hint(x) for x in (a.get_stride()[0], b.get_stride()[0],
                                              layout.stride[0])) if batch else None,
    )
    reason = problem.why_not()
    return (None, reason) if reason is not None else (problem, None)


def _max_configs() -> int | None:
    """How many configs the heuristic offers: ``config.gemm_max_configs``, or every
    candidate (None) with ``config.gemm_exhaustive``."""
    return None if config.gemm_exhaustive else config.gemm_max_configs


def gemm_choices(choices: list[Any], op: str, nodes: list[Any], layout: Any,
                 alpha: float = 1.0, beta: float = 0.0,
                 configs: list[GemmConfig] | None = None) -> None:
    """Append the Hopper GEMM's choices for ``op`` (see the module docstring); those of
    ``configs`` instead of the heuristic's, where given (config sweeps)."""
    problem, reason = gemm_problem(nodes, layout)
    if reason is not None:
        log.debug("no CuteDSL GEMM choice for %s: %s", op, reason)
        return
    if configs is None:
        configs = ranked_configs(pick_configs, problem, layout)
    append_choices(choices, nodes, layout, [problem], configs, op == "addmm", alpha, beta)


def swiglu_choices(choices: list[Any], nodes: list[Any], layout: Any,
                   configs: list[GemmConfig] | None = None) -> None:
    """Append the two-weight kernel's choices for ``silu(x @ w_gate) * (x @ w_up)``,
    ``nodes`` = [x, w_gate, w_up] (weights as the mm's (K, N) operands, of one layout);
    none, with a debug log, where the GEMM of x and either weight does not suit the
    kernel (see ``gemm_problem``)."""
    x, w_gate, w_up = nodes
    problem, reason = gemm_problem([x, w_gate], layout)
    if reason is None:
        up_problem, reason = gemm_problem([x, w_up], layout)
        if reason is None and up_problem.b_major != problem.b_major:
            reason = "the two weights differ in layout"
    if reason is not None:
        log.debug("no CuteDSL SwiGLU choice: %s", reason)
        return
    if configs is None:
        configs = ranked_configs(swiglu_configs, problem, layout)
    append_choices(choices, nodes, layout, [problem, up_problem], configs)


def ranked_configs(ranker: Any, problem: GemmProblem, layout: Any) -> list[GemmConfig]:
    """The heuristic's configs (``ranker``: ``pick_configs`` or ``swiglu_configs``), launched
    with programmatic dependent launch where ``config.gemm_pdl`` says."""
    ranked = ranker(problem.m, problem.n, problem.k, problem.a_dtype,
                    max_configs=_max_configs(), l=problem.l, out_dtype=layout.dtype)
    return [cfg.replace(pdl=True) for cfg in ranked] if config.gemm_pdl else ranked


def append_choices(choices: list[Any], nodes: list[Any], layout: Any,
                   problems: list[GemmProblem], configs: list[GemmConfig],
                   has_bias: bool = False, alpha: float = 1.0, beta: float = 0.0,
                   scales: tuple[str, ...] | None = None) -> None:
    """One choice per config that the kernel can run on every one of ``problems``
    (swapped for a swap-AB config); ``scales``: see ``_params``."""
    for cfg in configs:
        if any((p.swapped() if cfg.swap_ab else p).why_not(cfg) for p in problems):
            continue
        gemm_template.maybe_append_choice(choices, input_nodes=nodes, layout=layout,
                                          **_params(cfg, has_bias, alpha, beta, scales))


PRECOMPILE_SHAPE = (4096, 4096, 4096)


def precompile_choices(scratch: Any, shapes: list[tuple[int, int, int]] | None = None
                       ) -> list[Any]:
    """The choices for problems whose sizes and strides are multiples of 16 (the common
    class; others compile on first use): mm with B row-major and transposed (an
    nn.Linear weight), for bf16 and fp16, at each (M, N, K) of ``shapes`` (default:
    ``PRECOMPILE_SHAPE``; the heuristic picks different configs for different shapes);
    addmm with a bias vector and bmm, bf16, at ``PRECOMPILE_SHAPE``; SwiGLU's two-weight
    kernel (bf16, nn.Linear weights) at each shape.  Choices of different shapes that
    render the same kernel compile once."""
    from torch._inductor import ir

    m, n, k = PRECOMPILE_SHAPE

    def output(dtype: torch.dtype, *size: int) -> Any:
        return ir.FixedLayout(torch.device("cuda", 0), dtype, list(size))

    choices: list[Any] = []
    for sm, sn, sk in shapes or [PRECOMPILE_SHAPE]:
        for dtype in (torch.bfloat16, torch.float16):
            for b_stride in ((sn, 1), (1, sk)):
                a = scratch.input((sm, sk), dtype)
                b = scratch.input((sk, sn), dtype, b_stride)
                gemm_choices(choices, "mm", [a, b], output(dtype, sm, sn))
        x = scratch.input((sm, sk), torch.bfloat16)
        w_gate, w_up = (scratch.input((sk, sn), torch.bfloat16, (1, sk)) for _ in range(2))
        swiglu_choices(choices, [x, w_gate, w_up], output(torch.bfloat16, sm, sn))
    bf16 = torch.bfloat16
    a, w_t = scratch.input((m, k), bf16), scratch.input((k, n), bf16, (1, k))
    bias = scratch.input((m, n), bf16, (0, 1))
    gemm_choices(choices, "addmm", [bias, a, w_t], output(bf16, m, n), alpha=1.0, beta=1.0)
    a3, b3 = scratch.input((4, m // 4, k), bf16), scratch.input((4, k, n), bf16)
    gemm_choices(choices, "bmm", [a3, b3], output(bf16, 4, m // 4, n))
    return choices
