"""The FlexAttention backward template's choices compile GPU-less for sm_90a: bf16/fp16 x
head dims 64/128 x {no mods, causal, ALiBi with captured slopes, soft-capping, document
mask}, GQA and a broadcast KV batch, on flex's real subgraphs (the score_mod, its joint
graph and the mask_mod, traced by AOT autograd's backward, lowered by Inductor's
``build_subgraph_buffer``); captured tensors that need gradients (a learnable relative
bias table, ALiBi slopes, a per-head temperature), their scatters rendered as fp32
atomic adds; what the kernels cannot take is refused with the reason."""

import functools
import re

import pytest
import torch
from torch._inductor import ir

from cutedsl_inductor import config, counters
from cutedsl_inductor.compile.specs import Workspace
from cutedsl_inductor.kernels.attention.bwd_template import flex_bwd_choices
from tests.helpers import make_input, make_layout
from tests.template.test_subgraph import (
    SCORE_PLACEHOLDERS,
    alibi,
    causal,
    document,
    lowered_subgraph,
    soft_cap,
    traced,
)

B, H, S = 2, 4, 200  # S: not a multiple of the tiles
OPTIONS = dict(SPARSE_Q_BLOCK_SIZE=128, SPARSE_KV_BLOCK_SIZE=128, HAS_FULL_BLOCKS=True,
               SM_SCALE=0.125)
MODS = {"none": (None, None), "causal": (None, causal), "alibi": (alibi, None),
        "soft_cap": (soft_cap, causal), "document": (None, document)}


@functools.lru_cache(maxsize=None)
def traced_backward(score_mod=None, mask_mod=None, dtype=torch.bfloat16):
    """(score subgraph, its joint graph, mask subgraph, score captures, mask captures):
    the forward HOP's subgraphs as ``tests/template/test_subgraph.py`` traces them, the
    joint graph from them as flex's autograd makes it (``create_fw_bw_graph``; flex has
    no CPU backward to trace)."""
    from torch._higher_order_ops.flex_attention import create_fw_bw_graph
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    score_gm, mask_gm, score_caps, mask_caps = traced(score_mod, mask_mod)
    index_values = (torch.zeros((), dtype=dtype, requires_grad=True),
                    *(torch.zeros((), dtype=torch.int32) for _ in range(4)))
    caps = tuple(torch.empty_strided(c.shape, c.stride(), dtype=c.dtype) for c in score_caps)
    _, joint_gm = create_fw_bw_graph(score_gm, index_values, caps)
    # decomposed as Inductor decomposes the backward graph that holds it
    args = [t.detach() for t in index_values] + [torch.zeros((), dtype=dtype), *caps]
    joint_gm = make_fx(joint_gm, decomposition_table=select_decomp_table())(*args)
    return score_gm, joint_gm, mask_gm, score_caps, mask_caps


def learnable_rel_bias(score, b, h, q_idx, kv_idx, bias):
    return score + bias[h, q_idx - kv_idx + S - 1]


def learnable_alibi(score, b, h, q_idx, kv_idx, slopes):
    return score + slopes[h] * (kv_idx - q_idx)


def learnable_temperature(score, b, h, q_idx, kv_idx, temperature):
    return score * temperature[h]


def learnable_abs_bias(score, b, h, q_idx, kv_idx, bias):  # its gradient needs sign
    return score + bias[h].abs()


LEARNABLE = {"rel_bias": (learnable_rel_bias, (H, 2 * S - 1)),
             "alibi": (learnable_alibi, (H,)), "temperature": (learnable_temperature, (H,)),
             "abs_bias": (learnable_abs_bias, (H,))}


@functools.lru_cache(maxsize=None)
def traced_learnable(name, dtype=torch.bfloat16, captured_dtype=torch.float32):
    """(score subgraph, joint graph, captured tensor) of a score_mod whose captured tensor
    needs a gradient, traced as flex's autograd traces it: indexing under
    ``TransformGetItemToIndex`` (so the joint graph scatters with ``zeros_and_scatter``),
    decomposed as Inductor decomposes the graphs that hold them."""
    from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex
    from torch._higher_order_ops.flex_attention import create_fw_bw_graph
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    mod, shape = LEARNABLE[name]
    captured = torch.randn(shape, dtype=captured_dtype)
    index_values = (torch.zeros((), dtype=dtype, requires_grad=True),
                    *(torch.zeros((), dtype=torch.int32) for _ in range(4)))
    args = [t.detach() for t in index_values]
    with TransformGetItemToIndex():
        _, joint_gm = create_fw_bw_graph(mod, index_values, (captured.requires_grad_(),))
        fw_gm = make_fx(mod, decomposition_table=select_decomp_table())(
            *args, captured.detach())
    grad = torch.zeros((), dtype=fw_gm(*args, captured.detach()).dtype)
    joint_gm = make_fx(joint_gm, decomposition_table=select_decomp_table())(
        *args, grad, captured.detach())
    return fw_gm, joint_gm, None, (captured.detach(),), ()


def bwd_inputs(graph, dtype=torch.bfloat16, head_dim=64, mods=(None, None), kv_heads=H,
               kv_batch=B, learnable=None, captured_dtype=torch.float32):
    """The backward lowering's autotuning inputs, grad_key's layout and the subgraphs;
    ``learnable``: a LEARNABLE score_mod (no mask_mod), its captured tensor needing a
    gradient (the inputs then end with its zeroed fp32 gradient buffer, as the
    lowering's do)."""
    from torch._inductor.virtualized import V

    if learnable is None:
        fw_gm, joint_gm, mask_gm, score_caps, mask_caps = traced_backward(*mods, dtype)
    else:
        fw_gm, joint_gm, _, score_caps, mask_caps = traced_learnable(learnable, dtype,
                                                                     captured_dtype)
        mask_gm = traced_backward(None, None, dtype)[2]
    q = make_input(graph, "q", (B, H, S, head_dim), dtype)
    k = make_input(graph, "k", (kv_batch, kv_heads, S, head_dim), dtype)
    v = make_input(graph, "v", (kv_batch, kv_heads, S, head_dim), dtype)
    lse, delta = make_input(graph, "lse", (B, H, S)), make_input(graph, "delta", (B, H, S))
    grad_out = make_input(graph, "grad_out", (B, H, S, head_dim), dtype)
    grad_query = make_input(graph, "grad_query", (B, H, S, head_dim), dtype)
    grad_value = make_input(graph, "grad_value", (B, kv_heads, S, head_dim), dtype)
    blocks = (S + 127) // 128
    sparse = []
    for prefix in ("kv", "q", "full_kv", "full_q"):
        sparse += [make_input(graph, f"{prefix}_num", (B, H, blocks), torch.int32),
                   make_input(graph, f"{prefix}_idx", (B, H, blocks, blocks), torch.int32)]
    score_ph = [("score", dtype), *SCORE_PLACEHOLDERS[1:]]
    score, score_inputs = lowered_subgraph(graph, fw_gm, score_ph, score_caps, "score_cap")
    joint, _ = lowered_subgraph(graph, joint_gm, [*score_ph, ("grad_score_mod", dtype)],
                                score_caps, "score_cap")
    mask, mask_inputs = lowered_subgraph(graph, mask_gm, SCORE_PLACEHOLDERS[1:], mask_caps,
                                         "mask_cap")
    scatters = []
    if isinstance(joint.body, list):  # grad_input, four None, a scatter per captured tensor
        scatters = [buf for buf in joint.body[5:] if buf is not None]
    grads = [ir.TensorBox.create(V.graph.get_buffer(buf.get_name())) for buf in scatters]
    nodes = [q, k, v, lse, delta, grad_out, grad_query, grad_value, *sparse, *score_inputs,
             *mask_inputs, *grads]
    joint_body = joint.body[0] if isinstance(joint.body, list) else joint.body
    return (nodes, make_layout((B, kv_heads, S, head_dim), dtype),
            [score.body, joint_body, mask.body, scatters])


@pytest.mark.parametrize("mods", list(MODS))
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_kernels_compile(graph, dtype, head_dim, mods):
    nodes, layout, subgraphs = bwd_inputs(graph, dtype, head_dim, MODS[mods])
    choices = []
    assert flex_bwd_choices(choices, nodes, layout, subgraphs, OPTIONS) is None
    assert len(choices) >= 1
    compiled = counters.kernels.compiled
    choices[0].load()  # sm_90a, TVM-FFI
    assert counters.kernels.compiled == compiled + 1
    kernel = choices[0].source.split("@cute.jit\ndef cutedsl_sm90_flex_attention_bwd")[0]
    if mods in ("alibi", "document"):
        assert "captures[0][" in kernel
    if mods == "soft_cap":
        assert "tanh" in kernel


@pytest.mark.parametrize("mods", ["none", "causal", "alibi"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_the_fused_dq_kernel_compiles_with_its_workspace(graph, head_dim, mods, monkeypatch):
    """``flex_bwd_fused_dq``: one kernel adds dQ into a zeroed fp32 workspace of the
    query's size, then a cast kernel writes grad_query."""
    monkeypatch.setattr(config, "flex_bwd_fused_dq", True)
    nodes, layout, subgraphs = bwd_inputs(graph, head_dim=head_dim, mods=MODS[mods])
    choices = []
    assert flex_bwd_choices(choices, nodes, layout, subgraphs, OPTIONS) is None
    assert choices[0].workspace == Workspace(B * H * S * head_dim, "float32")
    assert "FUSED_DQ: cutlass.Constexpr = True" in choices[0].source
    choices[0].load()


@pytest.mark.parametrize("knob, define, field", [("flex_bwd_lpt", "LPT", "lpt"),
                                                 ("flex_bwd_early_s", "EARLY_S", "early_s")])
def test_the_dkdv_knobs_off_leave_the_source_as_before(graph, knob, define, field):
    """``config.flex_bwd_lpt``, ``config.flex_bwd_early_s``: off, the rendered source
    names neither (the configs of before the knobs keep their sources and cache keys); on,
    the define and the config's field are all that differ, and the kernels compile (GQA:
    a section's heads are KV heads, a walk of two Q heads carries early S^T across them)."""
    sources = {}
    for on in (False, True):
        nodes, layout, subgraphs = bwd_inputs(graph, head_dim=128, kv_heads=2,
                                              mods=MODS["causal"])
        choices = []
        with config.patch(**{knob: on}):
            assert flex_bwd_choices(choices, nodes, layout, subgraphs, OPTIONS) is None
        sources[on] = choices[0].source.replace(choices[0].name, "NAME")
    assert field not in sources[False].lower()
    assert sources[True].replace(f"{define}: cutlass.Constexpr = True\n", "").replace(
        f", {field}={define}", "") == sources[False]
    choices[0].load()


@pytest.mark.parametrize("other", [dict(flex_bwd_fused_dq=True), dict(flex_pipelined=False)])
def test_early_s_is_ignored_where_the_step_is_fused_or_serial(graph, other):
    nodes, layout, subgraphs = bwd_inputs(graph, head_dim=128, mods=MODS["causal"])
    choices = []
    with config.patch(flex_bwd_early_s=True, **other):
        assert flex_bwd_choices(choices, nodes, layout, subgraphs, OPTIONS) is None
    assert "early_s" not in choices[0].source.lower()


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("kv_batch", [B, 1])
def test_gqa_compiles(graph, head_dim, kv_batch):
    nodes, layout, subgraphs = bwd_inputs(graph, head_dim=head_dim, kv_heads=2,
                                          kv_batch=kv_batch, mods=MODS["causal"])
    choices = []
    assert flex_bwd_choices(choices, nodes, layout, subgraphs, OPTIONS) is None
    choices[0].load()


def test_one_huge_block_without_full_blocks_compiles(graph):
    """flex's "no mask" BlockMask: one block of 2**30, no full blocks (their tensors one
    unused element each, as ``inductor/flex.py`` makes them)."""
    nodes, layout, subgraphs = bwd_inputs(graph)
    for i in (12, 13, 14, 15):
        nodes[i] = make_input(graph, f"no_full_{i}", (1,))
    options = {**OPTIONS, "SPARSE_Q_BLOCK_SIZE": 1 << 30, "SPARSE_KV_BLOCK_SIZE": 1 << 30,
               "HAS_FULL_BLOCKS": False}
    choices = []
    assert flex_bwd_choices(choices, nodes, layout, subgraphs, options) is None
    choices[0].load()


@pytest.mark.parametrize("kwargs, options, subgraphs, reason", [
    (dict(head_dim=32), {}, None, "head dims q/k 32/32, v 32"),
    (dict(dtype=torch.float32), {}, None, "dtype torch.float32"),
    (dict(kv_heads=3), {}, None, "q heads 4 / kv heads 3"),
    ({}, dict(SPARSE_KV_BLOCK_SIZE=64), None, "both must be multiples of 128"),
    (dict(learnable="rel_bias"), {}, "no scatter", "Pointwise, not a scatter"),
    (dict(learnable="rel_bias"), {}, "no grad input", "are not among the inputs"),
    (dict(learnable="rel_bias"), {}, "bf16 grad", "(fp32 only)"),
    (dict(learnable="abs_bias"), {}, None, "op sign is not supported"),
])
def test_refusals_say_why(graph, kwargs, options, subgraphs, reason):
    nodes, layout, graphs = bwd_inputs(graph, **kwargs)
    if subgraphs == "no scatter":  # the gradient computed elementwise, not scattered
        graphs[3] = [graphs[0]]
    elif subgraphs == "no grad input":
        nodes = nodes[:-1]
    elif subgraphs == "bf16 grad":  # an atomic add only into fp32
        grad = nodes[-1]
        nodes[-1] = make_input(graph, grad.get_name(), grad.get_size(), torch.bfloat16)
    choices = []
    assert reason in flex_bwd_choices(choices, nodes, layout, graphs, {**OPTIONS, **options})
    assert choices == []


@pytest.mark.parametrize("mods, learnable, plain", [
    ("none", None, True), ("causal", None, True), ("document", None, True),
    ("alibi", None, False), ("soft_cap", None, False), ("none", "temperature", False)])
def test_plain_scores_only_where_the_score_mod_is_the_identity(graph, mods, learnable,
                                                               plain):
    """PLAIN_SCORES (P computed once and kept in fp32, dS = P (dP - delta) with no second
    exp2) holds only where the score_mod returns its score and the joint graph the
    incoming gradient unchanged."""
    nodes, layout, subgraphs = bwd_inputs(graph, mods=MODS[mods], learnable=learnable)
    choices = []
    assert flex_bwd_choices(choices, nodes, layout, subgraphs, OPTIONS) is None
    assert f"PLAIN_SCORES: cutlass.Constexpr = {plain}" in choices[0].source


def kernel_text(choice):
    """The rendered module's text before the entry."""
    return choice.source.split("@cute.jit\ndef cutedsl_sm90_flex_attention_bwd")[0]


@pytest.mark.parametrize("learnable", ["rel_bias", "alibi"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_captured_grads_compile(graph, dtype, head_dim, learnable):
    """The joint graph's scatter becomes an fp32 atomic add into the gradient buffer (the
    last input, a mutated one), in ``grad_captures`` under the kept-element guard."""
    nodes, layout, subgraphs = bwd_inputs(graph, dtype, head_dim, learnable=learnable)
    assert len(subgraphs[3]) == 1
    choices = []
    assert flex_bwd_choices(choices, nodes, layout, subgraphs, OPTIONS) is None
    text = kernel_text(choices[0])
    guarded = text.split("def grad_captures(")[1].split("\n\n")[0]
    assert "        if keep:\n" in guarded
    adds = re.findall(r"cute\.arch\.red\(captures\[(\d)\]\.iterator \+ \((.*)\), (\w+), "
                      r"op='add', dtype=cutlass\.Float32, sem='relaxed', scope='gpu'\)", guarded)
    assert len(adds) == 1 and "cute.arch.red" not in text.replace(guarded, "")
    slot, index, _ = adds[0]
    # the gradient buffer is the captures entry the add goes to (after the captured tensor)
    entry = choices[0].source.split("@cute.jit\ndef cutedsl_sm90_flex_attention_bwd")[1]
    views = re.findall(r"cute\.make_tensor\((\w+)\.iterator", entry.split("kernel(")[-1])
    assert views[int(slot)] == f"arg_input_{len(nodes) - 1}"
    if learnable == "rel_bias":  # bias[h, q_idx - kv_idx + S - 1]: row stride 2 S - 1
        assert f"{2 * S - 1}*" in index.replace(" ", "")
    compiled = counters.kernels.compiled
    choices[0].load()  # sm_90a, TVM-FFI
    assert counters.kernels.compiled == compiled + 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_slope_gradient_keeps_the_index_difference_exact(graph, dtype):
    """ALiBi's slope gradient is grad * (kv_idx - q_idx): the joint graph casts the index
    difference to the 16-bit score dtype, which Triton computes as fp32. A 16-bit cast
    here would round every distance past 256 (bf16) or 2048 (fp16)."""
    nodes, layout, subgraphs = bwd_inputs(graph, dtype, 64, learnable="alibi")
    choices = []
    assert flex_bwd_choices(choices, nodes, layout, subgraphs, OPTIONS) is None
    guarded = kernel_text(choices[0]).split("def grad_captures(")[1].split("\n\n")[0]
    difference = re.search(r"(\w+) = (\w+) - (\w+)\n", guarded)
    assert difference, guarded
    assert f"{difference[1]}.to(cutlass.Float32)" in guarded
    assert not re.search(r"\.to\(cutlass\.B?Float16\)", guarded), guarded


@pytest.mark.parametrize("learnable, captured_dtype, kv_heads", [
    ("temperature", torch.float32, H),  # the gradient reads the score: grad * score
    ("rel_bias", torch.bfloat16, H),  # a 16-bit table: its gradient still adds in fp32
    ("alibi", torch.float32, 2),  # GQA
])
def test_more_captured_grads_compile(graph, learnable, captured_dtype, kv_heads):
    nodes, layout, subgraphs = bwd_inputs(graph, learnable=learnable, kv_heads=kv_heads,
                                          captured_dtype=captured_dtype)
    assert nodes[-1].get_dtype() == torch.float32  # zeros_and_scatter's buffer
    choices = []
    assert flex_bwd_choices(choices, nodes, layout, subgraphs, OPTIONS) is None
    assert "cute.arch.red(captures[1]" in kernel_text(choices[0])
    choices[0].load()
