"""The FlexAttention backward (``sm90_flex_bwd.py``) as a CuteDSL template: choices for
flex_attention_backward's lowering (``inductor/flex.py`` offers them).

The rendered module subclasses ``Sm90FlexBackward`` with the score_mod (subgraph 0),
its joint graph's gradient w.r.t. the score (subgraph 1), the mask_mod (subgraph 2)
and, where captured tensors need gradients, the joint graph's scatters into them
(subgraph 3, ``grad_captures``: fp32 atomic adds from the dK/dV kernel) rendered by the
``modification`` hook. Its entry takes the inputs in the order of the
lowering's autotuning inputs -- q, k, v, lse, delta, grad_out, grad_query, grad_value,
kv_num_blocks, kv_indices, q_num_blocks, q_indices, full_kv_num_blocks,
full_kv_indices, full_q_num_blocks, full_q_indices, then the captured buffers -- and
writes grad_key (the output: (Q batch, KV heads, KV_LEN, D), Inductor sums a broadcast
KV batch) and grad_query, grad_value and the captured tensors' gradient buffers (the
mutated inputs: the lowering's autotuning inputs end with those buffers, fp32, zeroed by
Inductor's ``zeros_and_scatter`` lowering before the kernel, and cast by the lowering
to a 16-bit captured tensor's dtype after it). ``PLAIN_SCORES`` (the kernel's
``plain_scores``) is set where subgraph 0 returns its ``score`` placeholder and subgraph 1
its ``grad_score_mod`` unchanged.

``flex_bwd_choices(choices, nodes, layout, subgraphs, options)`` checks that the problem
suits the kernels and appends one choice per config; otherwise it returns the reason
(the caller logs it) and Inductor's Triton choices stay. Refused, beyond the forward's
refusals (``template.why_not``): a gradient buffer that is not among the inputs, a
grad_out that TMA cannot read, a BlockMask whose blocks are no multiples of 128; a
scatter that does not translate (not an atomic add of one element, an index that needs
runtime values: ``template/subgraph.py``) fails to render, so the choice is dropped
with the reason and Inductor's Triton backward runs.
"""

from __future__ import annotations

import math
from typing import Any

from torch._inductor import ir

from ... import config
from ...compile.records import Params
from ...compile.specs import Workspace, static_ints
from ...template.subgraph import ModificationSubgraph, returned_placeholder
from ...template.template import CuteDSLTemplate
from . import sm90_flex_bwd  # noqa: F401  (the rendered module imports it: fail early)
from .bwd_config import FlexBwdConfig, default_bwd_configs
from .template import SCORE_INDEX_DTYPES, why_not

BWD_INPUTS = ("q", "k", "v", "lse", "delta", "grad_out", "grad_query", "grad_value",
              "kv_num_blocks", "kv_indices", "q_num_blocks", "q_indices",
              "full_kv_num_blocks", "full_kv_indices", "full_q_num_blocks", "full_q_indices")

BWD_SOURCE = r'''
from cutedsl_inductor.kernels.attention.bwd_config import FlexBwdConfig
from cutedsl_inductor.kernels.attention.sm90_flex_bwd import Sm90FlexBackward

{{gen_defines()}}


class {{kernel_name}}_FlexBwd(Sm90FlexBackward):
    captured_grads = CAPTURED_GRADS
    plain_scores = PLAIN_SCORES

    @cute.jit
    def score_mod(self, score, b_idx, h_idx, q_idx, kv_idx, in_bounds, captures):
        {{modification(0, "modified", score="score", b="b_idx", h="h_idx", m="q_idx",
                       n="kv_idx")}}
        return modified

    @cute.jit
    def joint_mod(self, score, grad, b_idx, h_idx, q_idx, kv_idx, in_bounds, captures):
        {{modification(1, "grad_score", score="score", grad_score_mod="grad", b="b_idx",
                       h="h_idx", m="q_idx", n="kv_idx")}}
        return grad_score

    @cute.jit
    def mask_mod(self, b_idx, h_idx, q_idx, kv_idx, in_bounds, captures):
        {{modification(2, "keep", b="b_idx", h="h_idx", m="q_idx", n="kv_idx",
                       input_dtypes={"b": "int32", "h": "int32", "m": "int32", "n": "int32"})}}
        return keep
{%- if CAPTURED_GRADS %}

    @cute.jit
    def grad_captures(self, score, grad, b_idx, h_idx, q_idx, kv_idx, keep, captures):
        if keep:
            {{modification(3, None, score="score", grad_score_mod="grad", b="b_idx",
                           h="h_idx", m="q_idx", n="kv_idx")}}
{%- endif %}


@cute.jit
{{def_kernel("q", "k", "v", "lse", "delta", "grad_out", "grad_query", "grad_value", "kv_num_blocks", "kv_indices", "q_num_blocks", "q_indices", "full_kv_num_blocks", "full_kv_indices", "full_q_num_blocks", "full_q_indices")}}
    kernel = {{kernel_name}}_FlexBwd(FlexBwdConfig(
        head_dim=HEAD_DIM, stages=STAGES, sparse_q_block=SPARSE_Q_BLOCK,
        sparse_kv_block=SPARSE_KV_BLOCK, has_full_blocks=HAS_FULL_BLOCKS, sm_scale=SM_SCALE,
        pipelined=PIPELINED, fused_dq=FUSED_DQ
        {{- ", lpt=LPT" if LPT is defined else ""}}
        {{- ", early_s=EARLY_S" if EARLY_S is defined else ""}}))
    kernel(q, k, v, lse, delta, grad_out, grad_query, {{get_output()}}, grad_value,
           q_num_blocks, q_indices, full_q_num_blocks, full_q_indices, kv_num_blocks,
           kv_indices, full_kv_num_blocks, full_kv_indices, {{modification_inputs()}}, stream
           {%- if FUSED_DQ %}, {{get_workspace()}}{% endif %})
'''

flex_bwd_template = CuteDSLTemplate("sm90_flex_attention_bwd", BWD_SOURCE)


def why_not_bwd(nodes: list[Any], layout: Any, subgraphs: list[Any]) -> str | None:
    """Why the kernels cannot take this backward problem, or None."""
    if len(nodes) < len(BWD_INPUTS):
        return f"{len(nodes)} inputs, not flex's {len(BWD_INPUTS)} and the captures"
    if len(subgraphs) < 3:
        return f"{len(subgraphs)} subgraphs, not flex's score_mod, joint and mask_mod"
    scatters = grad_scatters(subgraphs)
    for buf in scatters:
        if not (isinstance(buf, ir.ComputedBuffer) and isinstance(buf.data, ir.Scatter)):
            return (f"a captured tensor's gradient is {type(getattr(buf, 'data', buf)).__name__}"
                    ", not a scatter: not supported by the CuteDSL backward")
    names = [buf.get_name() for buf in scatters]
    missing = sorted(set(names) - {n.get_name() for n in nodes})
    if missing:
        return (f"the gradient buffers {missing} of captured tensors are not among the "
                "inputs: not supported by the CuteDSL backward")
    reason = why_not(nodes[:3] + nodes[3:9], layout)
    if reason is not None:
        return reason
    grad_out = nodes[5]
    if grad_out.get_dtype() != nodes[0].get_dtype():
        return f"grad_out's dtype {grad_out.get_dtype()} is not the query's"
    stride = static_ints(grad_out.get_stride())
    offset = static_ints([grad_out.get_layout().offset])
    if stride is None or offset is None:
        return "grad_out has dynamic strides"
    if stride[3] != 1 or any(s % 8 for s in stride[:3]) or offset[0] % 8:
        return f"grad_out's strides {stride}: unit stride in the head dim, 16-byte others"
    return None


def grad_scatters(subgraphs: list[Any]) -> list[Any]:
    """The joint graph's scatters into captured tensors' gradients (flex's subgraph 3: a
    list, one ``ComputedBuffer`` per captured tensor that needs a gradient)."""
    scatters = subgraphs[3] if len(subgraphs) > 3 else None
    return list(scatters or [])


def flex_bwd_choices(choices: list[Any], nodes: list[Any], layout: Any, subgraphs: list[Any],
                     options: dict[str, Any]) -> str | None:
    """Append our choices for one flex_attention_backward lowering; return why none, or
    None. ``nodes``: the lowering's autotuning inputs; ``subgraphs``: its four (score_mod,
    joint gradient, mask_mod, captured-gradient scatters); ``options``: its kernel options
    (SM_SCALE, SPARSE_*_BLOCK_SIZE, HAS_FULL_BLOCKS). At most ``config.flex_max_configs``."""
    reason = why_not_bwd(nodes, layout, subgraphs)
    if reason is not None:
        return reason
    head_dim = int(nodes[0].get_size()[3])
    try:
        configs = default_bwd_configs(head_dim, int(options["SPARSE_Q_BLOCK_SIZE"]),
                                      int(options["SPARSE_KV_BLOCK_SIZE"]),
                                      bool(options["HAS_FULL_BLOCKS"]),
                                      float(options["SM_SCALE"]), config.flex_pipelined,
                                      config.flex_bwd_fused_dq, config.flex_bwd_lpt,
                                      config.flex_bwd_early_s and config.flex_pipelined
                                      and not config.flex_bwd_fused_dq)
    except (KeyError, TypeError, ValueError) as err:
        return f"flex's kernel options: {type(err).__name__}: {err}"
    if not configs:
        return (f"no config fits the BlockMask's blocks ({options['SPARSE_Q_BLOCK_SIZE']}, "
                f"{options['SPARSE_KV_BLOCK_SIZE']}): both must be multiples of 128")
    dtype = nodes[0].get_dtype()
    score = ModificationSubgraph(subgraphs[0], {"score": dtype, **SCORE_INDEX_DTYPES})
    joint = ModificationSubgraph(subgraphs[1], {"score": dtype, "grad_score_mod": dtype,
                                                **SCORE_INDEX_DTYPES})
    scatters = grad_scatters(subgraphs)  # into the captured tensors' gradients
    dtypes = joint.input_dtypes  # the joint graph's placeholders: the scatters' too
    names = [buf.get_name() for buf in scatters]
    grads = [n for n in nodes if n.get_name() in names]
    # the score_mod returns the score and its gradient the incoming one: P once, in fp32
    plain = (returned_placeholder(score) == "score"
             and returned_placeholder(joint) == "grad_score_mod")
    errors = []
    configs = configs[:config.flex_max_configs]
    for cfg in configs:
        error = flex_bwd_template.maybe_append_choice(
            choices, input_nodes=list(nodes), layout=layout,
            workspace=dq_workspace(nodes[0]) if cfg.fused_dq else None,
            mutated_inputs=[nodes[6], nodes[7], *grads],
            subgraphs=[score, joint, subgraphs[2], ModificationSubgraph(scatters, dtypes)],
            CAPTURED_GRADS=bool(scatters), PLAIN_SCORES=plain, **bwd_params_of(cfg))
        if error is not None:
            errors.append(str(error))
    return "; ".join(errors) if len(errors) == len(configs) else None


def bwd_params_of(cfg: FlexBwdConfig) -> Params:
    """The template's parameters; LPT and EARLY_S only where on, so that the other
    configs' sources (and cache keys) stay those of before the knobs."""
    optional = {name: True for name, on in (("LPT", cfg.lpt), ("EARLY_S", cfg.early_s)) if on}
    return Params.of(dict(HEAD_DIM=cfg.head_dim, STAGES=cfg.stages, SPARSE_Q_BLOCK=cfg.sparse_q_block,
                SPARSE_KV_BLOCK=cfg.sparse_kv_block, HAS_FULL_BLOCKS=cfg.has_full_blocks,
                SM_SCALE=cfg.sm_scale, PIPELINED=cfg.pipelined, FUSED_DQ=cfg.fused_dq,
                **optional))


def dq_workspace(query: Any) -> Workspace:
    """The fused dQ's fp32 accumulator, (B, H, Q_LEN, D) elements, zeroed for each call."""
    return Workspace(math.prod(int(n) for n in query.get_size()), "float32")
