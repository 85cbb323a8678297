"""The ``{{modification(...)}}`` hook on flex_attention's real subgraphs: score_mods and
mask_mods traced by torch.compile (dynamo lifts their captured tensors, AOT autograd
gives the flex_attention HOP's aten subgraphs), lowered by Inductor's own
``build_subgraph_buffer``, rendered into a small CuTe DSL kernel over a (b, h, q, kv)
tile and compiled GPU-less for sm_90a."""

import functools
import re

import pytest
import torch
import tvm_ffi
from torch._inductor import ir

from cutedsl_inductor import CuteDSLTemplate
from cutedsl_inductor.exc import SubgraphError
from cutedsl_inductor.template.subgraph import ModificationSubgraph, returned_placeholder
from tests.helpers import make_input, make_layout

B, H, S = 2, 4, 16
CUDA = torch.device("cuda", 0)
SCORE_PLACEHOLDERS = [("score", torch.float32), ("b", torch.int32), ("h", torch.int32),
                      ("m", torch.int32), ("n", torch.int32)]

# one thread per kv_idx, one block per (b, h), a loop over q_idx; the score is modified
# (or masked: -inf where the mask_mod says False) and stored. The mask's placeholders
# are typed in the hook (input_dtypes), the score's by its ModificationSubgraph; GUARD
# guards the captured reads with a mask
SOURCE = r'''
{{gen_defines()}}

@cute.kernel
def {{kernel_name}}_kernel(gS: cute.Tensor, gO: cute.Tensor, captures):
    kv_idx, _, _ = cute.arch.thread_idx()
    b_idx, h_idx, _ = cute.arch.block_idx()
    for q_idx in cutlass.range(SEQ):
        score = gS[b_idx, h_idx, q_idx, kv_idx]
{%- if MASK %}
        {{modification(0, "keep", b="b_idx", h="h_idx", m="q_idx", n="kv_idx",
                       input_dtypes={"b": "int32", "h": "int32", "m": "int32", "n": "int32"})}}
        gO[b_idx, h_idx, q_idx, kv_idx] = cutlass.Float32(
            cutlass.select_(keep, score, cutlass.Float32(float("-inf"))))
{%- else %}
        {{modification(0, "modified", score="score", b="b_idx", h="h_idx", m="q_idx", n="kv_idx",
                       mask="kv_idx < %d" % SEQ if GUARD else None)}}
        gO[b_idx, h_idx, q_idx, kv_idx] = modified
{%- endif %}


@cute.jit
{{def_kernel("scores")}}
    {{kernel_name}}_kernel(scores, {{get_output()}}, {{modification_inputs()}}).launch(
        grid=[{{size("scores", 0)}}, {{size("scores", 1)}}, 1], block=[SEQ, 1, 1], stream=stream)
'''
template = CuteDSLTemplate("flex_mod_probe", SOURCE)


@functools.lru_cache(maxsize=None)
def traced(score_mod=None, mask_mod=None):
    """The flex_attention HOP's (score subgraph, mask subgraph, score captures, mask
    captures) for these mods: GraphModules (decomposed as Inductor decomposes them) and
    the captured tensors' fake values."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.decomposition import select_decomp_table
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch._dynamo.reset()  # each mod compiles afresh (else dynamo's recompile limit)
    graphs = []

    def keep(gm, _):
        graphs.append(gm)
        return gm.forward

    block_mask = None if mask_mod is None else create_block_mask(mask_mod, B, H, S, S,
                                                                 device="cpu")
    q = torch.randn(B, H, S, 16)
    fn = torch.compile(lambda q: flex_attention(q, q, q, score_mod=score_mod,
                                                block_mask=block_mask),
                       backend=aot_autograd(fw_compiler=keep,
                                            decompositions=select_decomp_table()),
                       fullgraph=True)
    with torch.no_grad():
        fn(q)
    gm = graphs[0]
    node = next(n for n in gm.graph.nodes if n.target is torch.ops.higher_order.flex_attention)
    score_gm, mask_gm = getattr(gm, node.args[3].target), getattr(gm, node.args[4][-1].target)
    values = lambda nodes: tuple(n.meta["val"] for n in nodes)  # noqa: E731
    return score_gm, mask_gm, values(node.args[7]), values(node.args[8])


def lowered_subgraph(graph, gm, placeholders, captured, prefix):
    """Inductor's lowering of one subgraph on placeholders and captured graph inputs."""
    from torch._inductor.kernel.flex.common import build_subgraph_buffer, create_placeholder

    boxes = [create_placeholder(name, dtype, CUDA) for name, dtype in placeholders]
    inputs = [make_input(graph, f"{prefix}{i}", v.shape, v.dtype)
              for i, v in enumerate(captured)]
    body = build_subgraph_buffer(boxes + inputs, ir.Subgraph(name=prefix, graph_module=gm))
    return ModificationSubgraph.of(body, boxes), inputs


def choice_for(graph, score_mod=None, mask_mod=None, bare=False, guard=False,
               score_dtype=torch.float32):
    """A compiled choice of the probe template for one mod (the score_mod, or else the
    mask_mod); its source. ``bare``: the subgraph as the bare ComputedBuffer."""
    from cutedsl_inductor import counters

    score_gm, mask_gm, score_caps, mask_caps = traced(score_mod, mask_mod)
    scores = make_input(graph, "scores", (B, H, S, S))
    if mask_mod is None:
        placeholders = [("score", score_dtype), *SCORE_PLACEHOLDERS[1:]]
        subgraph, inputs = lowered_subgraph(graph, score_gm, placeholders, score_caps,
                                            "score_capture")
    else:
        subgraph, inputs = lowered_subgraph(graph, mask_gm, SCORE_PLACEHOLDERS[1:], mask_caps,
                                            "mask_capture")
    choice = template.generate(input_nodes=[scores, *inputs], layout=make_layout((B, H, S, S)),
                               subgraphs=[subgraph.body if bare else subgraph], SEQ=S,
                               MASK=mask_mod is not None, GUARD=guard)
    compiled = counters.kernels.compiled
    wrapper = choice.load()  # compiles for sm_90a, with TVM-FFI
    assert counters.kernels.compiled == compiled + 1
    assert isinstance(wrapper.kernel_fn, tvm_ffi.Function)
    return choice.source


def choice_text(source):
    """The kernel function's text (the modification's lines) and the entry's."""
    kernel, entry = source.split("@cute.jit", 1)
    return kernel, entry


SLOPES = torch.exp2(-torch.arange(1, H + 1, dtype=torch.float32))
REL_BIAS = torch.randn(H, 2 * S - 1)
DOC_IDS = torch.tensor([0] * 5 + [1] * 7 + [2] * 4, dtype=torch.int32)
DOC_IDS_LONG = DOC_IDS.long()
DOC_BIAS = torch.randn(3)
TEMPERATURE = torch.tensor(0.5)
WINDOW = 4


def alibi(score, b, h, q_idx, kv_idx):
    return score + SLOPES[h] * (kv_idx - q_idx)


def soft_cap(score, b, h, q_idx, kv_idx):
    return 20.0 * torch.tanh(score / 20.0)


def relative_position_bias(score, b, h, q_idx, kv_idx):
    return score + REL_BIAS[h, q_idx - kv_idx + S - 1]


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def sliding_window(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) & (q_idx - kv_idx <= WINDOW)


def document(b, h, q_idx, kv_idx):
    return (DOC_IDS[q_idx] == DOC_IDS[kv_idx]) & (q_idx >= kv_idx)


def document_long_ids(b, h, q_idx, kv_idx):
    return DOC_IDS_LONG[q_idx] == DOC_IDS_LONG[kv_idx]


def document_bias(score, b, h, q_idx, kv_idx):  # a captured tensor indexed by another's value
    return score + DOC_BIAS[DOC_IDS_LONG[q_idx]]


def integer_arithmetic(b, h, q_idx, kv_idx):  # //, %, trunc division, fmod, bitwise
    d = q_idx - kv_idx
    return (((q_idx // 4) == (kv_idx // 4)) | ((kv_idx % 8) == 0) | ~(h == b)
            | (torch.div(d, 3, rounding_mode="trunc") == torch.fmod(d, 5)) | ((d & 1) == 0))


def many_ops(score, b, h, q_idx, kv_idx):  # where, comparisons, exp, abs, casts, div
    distance = (q_idx - kv_idx).abs().to(torch.float32)
    decayed = score * torch.exp(-distance / 8.0) / (distance + 1.0) - 0.5
    return torch.where((q_idx >= kv_idx) | (h > 1), decayed, score.to(torch.bfloat16) / 2)


def test_alibi_reads_its_slopes_at_h(graph):
    kernel, entry = choice_text(choice_for(graph, score_mod=alibi))
    # h wraps as a negative index would in eager, then indexes the slopes
    assert "cutlass.select_(mod0_0_5, mod0_0_3, mod0_0_1)" in kernel
    assert "mod0_0_7 = captures[0][mod0_0_6]" in kernel
    assert "modified = mod0_0_13" in kernel
    assert "(cute.make_tensor(arg_input_1.iterator, " in entry  # the slopes, flat


def test_tanh_soft_capping_needs_no_captures(graph):
    kernel, entry = choice_text(choice_for(graph, score_mod=soft_cap))
    assert "cute.math.tanh(" in kernel and "captures[" not in kernel
    assert "out_ptr0, ())" in entry


def test_a_16_bit_score_placeholder_computes_in_fp32(graph):
    """flex types the score as the query (bf16); the template's fp32 score is upcast
    (a no-op), the constants keep their fp32 value as in Inductor's Triton code (1 / 20,
    not bf16's 0.050048828125: a soft cap's LSE drifts by 1e-2 with the rounded one), the
    result is fp32."""
    kernel, _ = choice_text(choice_for(graph, score_mod=soft_cap, score_dtype=torch.bfloat16))
    assert "mod0_0_0 = ((score)).to(cutlass.Float32)" in kernel
    assert "cutlass.Float32(0.05)" in kernel
    assert "modified = " in kernel and "BFloat16" not in kernel


def test_relative_position_bias_indexes_a_2d_table(graph):
    kernel, _ = choice_text(choice_for(graph, score_mod=relative_position_bias))
    read = next(line for line in kernel.splitlines() if "captures[0][" in line)
    # row h, column q_idx - kv_idx + 15, contiguous rows of 2 * S - 1
    assert re.search(rf"captures\[0\]\[mod0_0_\d+ \+ {2 * S - 1}\*mod0_0_\d+\]", read), read
    assert "mod0_0_9 = mod0_0_7 - mod0_0_8" in kernel and "mod0_0_7 = (q_idx)" in kernel


def test_a_captured_0d_tensor_is_read_at_0(graph):
    kernel, entry = choice_text(choice_for(graph, score_mod=lambda score, b, h, q, kv:
                                           score * TEMPERATURE))
    assert "mod0_0_1 = captures[0][0]" in kernel and entry.count("cute.make_tensor(") == 1


def test_identity_score_mod_returns_the_score(graph):
    kernel, _ = choice_text(choice_for(graph, score_mod=lambda score, b, h, q, kv: score))
    assert "modified = mod0_0_0" in kernel and "mod0_0_0 = (score)" in kernel


@pytest.mark.parametrize("score_mod, returned", [(None, "score"), (alibi, None),
                                               (soft_cap, None)])
def test_returned_placeholder_names_a_placeholder_returned_unchanged(graph, score_mod,
                                                                     returned):
    score_gm, _, caps, _ = traced(score_mod)
    subgraph, _ = lowered_subgraph(graph, score_gm, SCORE_PLACEHOLDERS, caps, "score_capture")
    assert returned_placeholder(subgraph) == returned
    assert returned_placeholder(subgraph.body) == returned


def test_many_ops_translate(graph):
    kernel, _ = choice_text(choice_for(graph, score_mod=many_ops))
    for text in ("cute.math.absi(", "cute.math.exp(", "cute.arch.rcp_approx(",
                 "cutlass.select_(", ">=", " | "):
        assert text in kernel, text
    assert "BFloat16" not in kernel  # a bf16 cast computes in fp32, as in Triton


def test_causal_mask(graph):
    kernel, _ = choice_text(choice_for(graph, mask_mod=causal))
    assert "mod0_0_2 = mod0_0_0 >= mod0_0_1" in kernel and "keep = mod0_0_2" in kernel


def test_sliding_window_mask(graph):
    kernel, _ = choice_text(choice_for(graph, mask_mod=sliding_window))
    assert " & " in kernel and f"cutlass.Int32({WINDOW})" in kernel


@pytest.mark.parametrize("mask_mod", [document, document_long_ids])
def test_document_mask_reads_the_ids_at_q_and_kv(graph, mask_mod):
    kernel, entry = choice_text(choice_for(graph, mask_mod=mask_mod))
    reads = [line for line in kernel.splitlines() if "captures[" in line]
    assert len(reads) == 2 and all("captures[0][" in r for r in reads), reads
    assert entry.count("cute.make_tensor(") == 1  # one captured tensor, read twice
    assert "keep = " in kernel


def test_an_int64_value_read_from_one_capture_indexes_another(graph):
    kernel, entry = choice_text(choice_for(graph, score_mod=document_bias))
    # the id (int64) wraps if negative, in Int64, and is narrowed to index the bias
    assert "mod0_0_7 = captures[0][mod0_0_6]" in kernel
    assert "mod0_0_12 = cutlass.Int64(cutlass.select_(mod0_0_11, mod0_0_9, mod0_0_7))" in kernel
    assert "mod0_0_13 = mod0_0_12.to(cutlass.Int32)" in kernel
    assert "mod0_0_14 = captures[1][mod0_0_13]" in kernel
    assert "captures[1][" in kernel and entry.count("cute.make_tensor(") == 2


def test_integer_division_remainders_and_bitwise_logic(graph):
    kernel, _ = choice_text(choice_for(graph, mask_mod=integer_arithmetic))
    # floor division is CuTe's //; Python's % is a - (a // b) * b; C's / and % (trunc,
    # fmod) correct the floor by one where inexact with operands of opposite signs
    assert kernel.count(" // ") == 5 and "~" in kernel and " & " in kernel
    assert kernel.count("cutlass.Int32(cutlass.select_(") == 2


def test_a_bare_subgraph_typed_by_the_hook(graph):
    kernel, _ = choice_text(choice_for(graph, mask_mod=causal, bare=True))
    assert "keep = mod0_0_2" in kernel


def test_a_mask_guards_the_captured_reads(graph):
    kernel, _ = choice_text(choice_for(graph, score_mod=alibi, guard=True))
    assert f"mod0_0_0 = cutlass.Boolean(kv_idx < {S})" in kernel
    assert "mod0_0_8 = cutlass.Int32(cutlass.select_(mod0_0_0, mod0_0_7, mod0_0_5))" in kernel
    assert "captures[0][mod0_0_8]" in kernel


def refused(graph, caplog, score_mod=None, mask_mod=None, bare=False, captures=True,
            subgraphs=None, mask_template=None):
    """The error of a choice the hook refuses (returned, logged, no choice made)."""
    import logging

    score_gm, mask_gm, score_caps, mask_caps = traced(score_mod, mask_mod)
    scores = make_input(graph, "scores", (B, H, S, S))
    gm, placeholders, caps = ((score_gm, SCORE_PLACEHOLDERS, score_caps) if mask_mod is None
                              else (mask_gm, SCORE_PLACEHOLDERS[1:], mask_caps))
    subgraph, inputs = lowered_subgraph(graph, gm, placeholders, caps, "capture")
    choices = []
    with caplog.at_level(logging.WARNING, logger="cutedsl_inductor"):
        err = template.maybe_append_choice(
            choices, input_nodes=[scores, *(inputs if captures else [])],
            layout=make_layout((B, H, S, S)),
            subgraphs=[subgraph.body if bare else subgraph] if subgraphs is None else subgraphs,
            SEQ=S, MASK=mask_template if mask_template is not None else mask_mod is not None,
            GUARD=False)
    assert choices == [] and isinstance(err, SubgraphError), err
    assert "'flex_mod_probe'" in str(err) and "SEQ=16" in str(err) and str(err) in caplog.text
    return str(err)


def test_an_op_not_translated_refuses_the_choice(graph, caplog):
    err = refused(graph, caplog, score_mod=lambda score, b, h, q, kv: torch.sin(score))
    assert "cannot render subgraph 0" in err and "op sin is not supported" in err


def test_a_captured_tensor_must_be_an_input_node(graph, caplog):
    err = refused(graph, caplog, score_mod=alibi, captures=False)
    assert "captured tensor capture0 is not among the choice's input nodes" in err


def test_a_placeholder_the_template_gives_no_value_is_refused(graph, caplog):
    err = refused(graph, caplog, score_mod=alibi, mask_template=True)  # mask hook: no score=
    assert "placeholder score has no value" in err


def test_an_untyped_placeholder_is_refused(graph, caplog):
    err = refused(graph, caplog, score_mod=soft_cap, bare=True)
    assert "placeholder score has no dtype" in err and "input_dtypes=" in err


def test_a_missing_subgraph_is_refused(graph, caplog):
    err = refused(graph, caplog, score_mod=soft_cap, subgraphs=[])
    assert "IndexError: the choice has 0 subgraph(s)" in err


def test_index_expr_of_indirect_indices_and_a_stray_symbol():
    """No flex mod we know makes ``index_expr``; Inductor may, from indirect indices."""
    import sympy

    from cutedsl_inductor.template.subgraph import Captures, SubgraphToCuteDSL

    handler = SubgraphToCuteDSL({"m": "q_idx"}, {"m": torch.int32}, Captures([]), "t")
    index = handler.indirect_indexing(handler.load("m", 0), S, wrap_neg=False)
    value = handler.index_expr(2 * index + 1, torch.float32)
    assert handler.lines[-2:] == [f"t1 = cutlass.Int32(1 + 2*{index})",
                                  "t2 = t1.to(cutlass.Float32)"]
    assert handler.dtype_of(value) == torch.float32
    with pytest.raises(NotImplementedError, match="runtime values in s0"):
        handler.index_expr(index + sympy.Symbol("s0"), torch.int32)
