"""The FlexAttention forward kernel (``sm90_flex.py``) as a CuteDSL template: choices for
flex_attention's lowering (``inductor/flex.py`` offers them).

The rendered module subclasses ``Sm90FlexAttention`` with the score_mod (subgraph 0)
and mask_mod (subgraph 1) rendered by the ``modification`` hook; its entry takes the
inputs in the order of flex's autotuning inputs -- q, k, v, lse, max, kv_num_blocks,
kv_indices, full_kv_num_blocks, full_kv_indices, then the captured buffers -- and
writes out, LSE and max (the two mutated inputs).

``flex_choices(choices, nodes, layout, subgraphs, options)`` checks that the problem
suits the kernel and appends one choice per config (``config.default_configs``); a
problem that does not suit gets none and the reason is returned (the caller logs it).
Refused here: a target other than sm_90, dtypes other than bf16/fp16 (one for q, k, v
and out), head dims other than 64/128 (or Q's and V's differing), non-unit head-dim
strides or other strides not 16-byte multiples, dynamic shapes, a BlockMask whose
block sizes are no multiples of the tiles, Q heads not a multiple of KV heads.
``FOLD_SCALE`` (``config.flex_fold_scale``) is set where subgraph 0 returns its
``score`` placeholder and SM_SCALE is positive. ``config.flex_persistent``: "choice"
adds the first config's persistent twin (which wins some masks and loses others) to the
``flex_max_configs`` offered; "on" makes every config persistent.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from ...compile.specs import static_ints
from ... import config
from ...compile.compiler import target_arch
from ...compile.records import Params
from ...template.subgraph import ModificationSubgraph, returned_placeholder
from ...template.template import CuteDSLTemplate
from . import sm90_flex  # noqa: F401  (the rendered module imports it: fail early)
from .config import FlexConfig, default_configs, persistent_twin

log = logging.getLogger(__name__)

SCORE_INDEX_DTYPES = {name: torch.int32 for name in "bhmn"}

FLEX_INPUTS = ("q", "k", "v", "lse", "max", "kv_num_blocks", "kv_indices",
               "full_kv_num_blocks", "full_kv_indices")

FLEX_SOURCE = r'''
from cutedsl_inductor.kernels.attention.config import FlexConfig
from cutedsl_inductor.kernels.attention.sm90_flex import Sm90FlexAttention

{{gen_defines()}}


class {{kernel_name}}_Flex(Sm90FlexAttention):
    @cute.jit
    def score_mod(self, score, b_idx, h_idx, q_idx, kv_idx, in_bounds, captures):
        {{modification(0, "modified", score="score", b="b_idx", h="h_idx", m="q_idx",
                       n="kv_idx")}}
        return modified

    @cute.jit
    def mask_mod(self, b_idx, h_idx, q_idx, kv_idx, in_bounds, captures):
        {{modification(1, "keep", b="b_idx", h="h_idx", m="q_idx", n="kv_idx",
                       input_dtypes={"b": "int32", "h": "int32", "m": "int32", "n": "int32"})}}
        return keep


@cute.jit
{{def_kernel("q", "k", "v", "lse", "max", "kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices")}}
    kernel = {{kernel_name}}_Flex(FlexConfig(
        head_dim=HEAD_DIM, block_n=BLOCK_N, stages=STAGES, sparse_q_block=SPARSE_Q_BLOCK,
        sparse_kv_block=SPARSE_KV_BLOCK, has_full_blocks=HAS_FULL_BLOCKS, sm_scale=SM_SCALE,
        pipelined=PIPELINED, pingpong=PINGPONG
        {{- ", persistent=PERSISTENT" if PERSISTENT is defined else ""}}
        {{- ", fold_scale=FOLD_SCALE" if FOLD_SCALE is defined else ""}}))
    kernel(q, k, v, {{get_output()}}, lse, max, kv_num_blocks, kv_indices, full_kv_num_blocks,
           full_kv_indices, {{modification_inputs()}}, stream)
'''

flex_template = CuteDSLTemplate("sm90_flex_attention", FLEX_SOURCE)


def why_not(nodes: list[Any], layout: Any) -> str | None:
    """Why the kernel cannot take this problem, or None."""
    if not target_arch().startswith("sm_90"):
        return f"the target is {target_arch()}, the kernel is for sm_90a"
    if len(nodes) < len(FLEX_INPUTS):
        return f"{len(nodes)} inputs, not flex's {len(FLEX_INPUTS)} and the captures"
    q, k, v = nodes[:3]
    dtype = q.get_dtype()
    if dtype not in (torch.bfloat16, torch.float16):
        return f"dtype {dtype}: the kernel takes bf16/fp16"
    if k.get_dtype() != dtype or v.get_dtype() != dtype or layout.dtype != dtype:
        return "q, k, v and out differ in dtype"
    shapes = [static_ints(n.get_size()) for n in (q, k, v)] + [static_ints(layout.size)]
    strides = [static_ints(n.get_stride()) for n in (q, k, v)] + [static_ints(layout.stride)]
    if any(s is None for s in shapes + strides):
        return "dynamic shapes (the kernel is compiled for static sizes)"
    (bq, hq, _, d), (bk, hk, _, dk), (_, _, _, dv) = shapes[:3]
    if not (d == dk == dv) or d not in (64, 128):
        return f"head dims q/k {d}/{dk}, v {dv}: the kernel takes one of 64, 128"
    if hq % hk or bk not in (1, bq):
        return f"q heads {hq} / kv heads {hk}, batches {bq} / {bk} do not broadcast"
    for name, node, stride in zip("qkv", (q, k, v), strides):
        if stride[3] != 1 or any(s % 8 for s in stride[:3]):
            return f"{name}'s strides {stride}: unit stride in the head dim, 16-byte others"
        if static_ints([node.get_layout().offset]) is None or node.get_layout().offset % 8:
            return f"{name}'s storage offset is not 16-byte aligned"
    return None


def flex_choices(choices: list[Any], nodes: list[Any], layout: Any, subgraphs: list[Any],
                 options: dict[str, Any]) -> str | None:
    """Append our choices for one flex_attention lowering; return why none, or None.
    ``nodes``: flex's autotuning inputs; ``subgraphs``: the score and mask
    ComputedBuffers (``build_subgraph_buffer``'s; the score's placeholder is typed as the
    query, as flex types it); ``options``: flex's kernel options (SM_SCALE,
    SPARSE_*_BLOCK_SIZE, HAS_FULL_BLOCKS). At most ``config.flex_max_configs`` choices,
and a persistent twin where ``config.flex_persistent`` is "choice"."""
    reason = why_not(nodes, layout)
    if reason is not None:
        return reason
    head_dim = int(nodes[0].get_size()[3])
    try:
        # the identity score_mod with a positive scale: sm_scale folded into the exp2
        fold = (config.flex_fold_scale and returned_placeholder(subgraphs[0]) == "score"
                and float(options["SM_SCALE"]) > 0)
        configs = default_configs(head_dim, int(options["SPARSE_Q_BLOCK_SIZE"]),
                                  int(options["SPARSE_KV_BLOCK_SIZE"]),
                                  bool(options["HAS_FULL_BLOCKS"]),
                                  float(options["SM_SCALE"]), config.flex_pipelined,
                                  config.flex_pingpong, config.flex_persistent == "on", fold)
    except (KeyError, TypeError, ValueError) as err:
        return f"flex's kernel options: {type(err).__name__}: {err}"
    if not configs:
        return (f"no config fits the BlockMask's blocks ({options['SPARSE_Q_BLOCK_SIZE']}, "
                f"{options['SPARSE_KV_BLOCK_SIZE']})")
    score = ModificationSubgraph(subgraphs[0], {"score": nodes[0].get_dtype(),
                                                **SCORE_INDEX_DTYPES})
    errors = []
    configs = configs[:config.flex_max_configs]
    if config.flex_persistent == "choice":  # one choice more: autotuning decides
        configs += persistent_twin(configs[0])
    for cfg in configs:
        error = flex_template.maybe_append_choice(
            choices, input_nodes=list(nodes), layout=layout,
            mutated_inputs=[nodes[3], nodes[4]], subgraphs=[score, subgraphs[1]],
            **params_of(cfg))
        if error is not None:
            errors.append(str(error))
    return "; ".join(errors) if len(errors) == len(configs) else None


def params_of(cfg: FlexConfig) -> Params:
    """The template's parameters; PERSISTENT and FOLD_SCALE only where on, so that the
    other configs' sources (and cache keys) stay those of before the knobs."""
    optional = {name: True for name, on in (("PERSISTENT", cfg.persistent),
                                            ("FOLD_SCALE", cfg.fold_scale)) if on}
    return Params.of(dict(HEAD_DIM=cfg.head_dim, BLOCK_N=cfg.block_n, STAGES=cfg.stages,
                SPARSE_Q_BLOCK=cfg.sparse_q_block, SPARSE_KV_BLOCK=cfg.sparse_kv_block,
                HAS_FULL_BLOCKS=cfg.has_full_blocks, SM_SCALE=cfg.sm_scale,
                PIPELINED=cfg.pipelined, PINGPONG=cfg.pingpong, **optional))
