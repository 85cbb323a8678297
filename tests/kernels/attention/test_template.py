"""The FlexAttention template's choices compile GPU-less for sm_90a: bf16/fp16 x head dims
64/128 x {no mods, causal, ALiBi with captured slopes, document mask}, on flex's real
score_mod/mask_mod subgraphs (traced as ``tests/template/test_subgraph.py`` traces them,
lowered by Inductor's ``build_subgraph_buffer``); what the kernel cannot take is refused
with the reason."""

import pytest
import torch

from cutedsl_inductor import config, counters
from cutedsl_inductor.kernels.attention.template import flex_choices
from tests.helpers import make_input, make_layout
from tests.template.test_subgraph import (
    SCORE_PLACEHOLDERS,
    alibi,
    causal,
    document,
    lowered_subgraph,
    traced,
)

B, H, S = 2, 4, 200  # S: not a multiple of the tiles
OPTIONS = dict(SPARSE_Q_BLOCK_SIZE=128, SPARSE_KV_BLOCK_SIZE=128, HAS_FULL_BLOCKS=True,
               SM_SCALE=0.125)
MODS = {"none": (None, None), "causal": (None, causal), "alibi": (alibi, None),
        "document": (None, document)}


def flex_inputs(graph, dtype=torch.bfloat16, head_dim=64, mods=(None, None), kv_heads=H,
                v_head_dim=None, kv_batch=B):
    """flex's autotuning inputs (q, k, v, lse, max, the BlockMask's four tensors, the
    captured buffers), the output layout and the two subgraphs' bodies."""
    score_mod, mask_mod = mods
    score_gm, mask_gm, score_caps, mask_caps = traced(score_mod, mask_mod)
    q = make_input(graph, "q", (B, H, S, head_dim), dtype)
    k = make_input(graph, "k", (kv_batch, kv_heads, S, head_dim), dtype)
    v = make_input(graph, "v", (kv_batch, kv_heads, S, v_head_dim or head_dim), dtype)
    lse, mx = make_input(graph, "lse", (B, H, S)), make_input(graph, "mx", (B, H, S))
    blocks = (S + 127) // 128
    sparse = [make_input(graph, name, shape, torch.int32) for name, shape in [
        ("kv_num", (B, H, blocks)), ("kv_idx", (B, H, blocks, blocks)),
        ("full_num", (B, H, blocks)), ("full_idx", (B, H, blocks, blocks))]]
    placeholders = [("score", dtype), *SCORE_PLACEHOLDERS[1:]]
    score, score_inputs = lowered_subgraph(graph, score_gm, placeholders, score_caps, "score_cap")
    mask, mask_inputs = lowered_subgraph(graph, mask_gm, SCORE_PLACEHOLDERS[1:], mask_caps,
                                         "mask_cap")
    nodes = [q, k, v, lse, mx, *sparse, *score_inputs, *mask_inputs]
    return nodes, make_layout((B, H, S, v_head_dim or head_dim), dtype), [score.body, mask.body]


@pytest.mark.parametrize("mods", list(MODS))
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_kernel_compiles(graph, dtype, head_dim, mods):
    nodes, layout, subgraphs = flex_inputs(graph, dtype, head_dim, MODS[mods])
    choices = []
    with config.patch(flex_persistent="off"):  # the twin: test_the_persistent_kernel_compiles
        assert flex_choices(choices, nodes, layout, subgraphs, OPTIONS) is None
    assert len(choices) == 2  # config.flex_max_configs: block_n 128 and 64
    compiled = counters.kernels.compiled
    for choice in choices:
        choice.load()  # sm_90a, TVM-FFI
    assert counters.kernels.compiled == compiled + 2
    kernel = choices[0].source.split("@cute.jit\ndef cutedsl_sm90_flex_attention")[0]
    if mods in ("alibi", "document"):
        assert "captures[0][" in kernel
    if mods == "causal":
        assert " >= " in kernel


@pytest.mark.parametrize("mods", ["none", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_the_persistent_kernel_compiles(graph, head_dim, mods):
    """``config.flex_persistent``: both offered configs persistent, compiled."""
    nodes, layout, subgraphs = flex_inputs(graph, torch.bfloat16, head_dim, MODS[mods])
    choices = []
    with config.patch(flex_persistent=True):
        assert flex_choices(choices, nodes, layout, subgraphs, OPTIONS) is None
    assert len(choices) == 2
    for choice in choices:
        assert "persistent=PERSISTENT" in choice.source
        choice.load()


def offered(inputs, **knobs):
    """Our choices for ``inputs`` (``flex_inputs``') with ``knobs`` set."""
    nodes, layout, subgraphs = inputs
    choices = []
    with config.patch(**knobs):
        assert flex_choices(choices, nodes, layout, subgraphs, OPTIONS) is None
    return choices


def source_of(choice):
    return choice.source.replace(choice.name, "NAME")


def without(source, define, field):
    """``source`` without the ``define`` a knob adds and the config field it sets."""
    return source.replace(f"{define}: cutlass.Constexpr = True\n", "").replace(
        f", {field}={define}", "")


def test_the_persistent_knob_off_leaves_the_source_as_before(graph):
    """Off, the rendered source names no persistence, so the configs of before the knob
    keep their sources; on, the PERSISTENT define and the config's field are all that
    differ."""
    inputs = flex_inputs(graph, mods=MODS["causal"])
    off, on = (source_of(offered(inputs, flex_persistent=mode)[0]) for mode in ("off", "on"))
    assert "persistent" not in off.lower()
    assert without(on, "PERSISTENT", "persistent") == off


def test_the_persistent_choice_adds_the_first_configs_twin(graph):
    """``flex_persistent="choice"`` (the default): the configs of "off", then the first
    one's persistent twin, whose source differs in the PERSISTENT define alone."""
    inputs = flex_inputs(graph, mods=MODS["causal"])
    plain = offered(inputs, flex_persistent="off")
    with_twin = offered(inputs, flex_persistent="choice")
    assert len(plain) == config.flex_max_configs and len(with_twin) == len(plain) + 1
    assert [c.name for c in with_twin[:-1]] == [c.name for c in plain]
    assert without(source_of(with_twin[-1]), "PERSISTENT", "persistent") == source_of(plain[0])


@pytest.mark.parametrize("mods, folded", [("causal", True), ("none", True), ("alibi", False)])
def test_the_fold_scale_knob_folds_the_identity_score_mod_alone(graph, mods, folded):
    """``config.flex_fold_scale``: the FOLD_SCALE define and the config's field where the
    score_mod is the identity (the rendered choice compiles), nothing where it is not;
    off, the source of before the knob."""
    inputs = flex_inputs(graph, mods=MODS[mods])
    off = source_of(offered(inputs, flex_fold_scale=False)[0])
    folded_choice = offered(inputs, flex_fold_scale=True)[0]
    on = source_of(folded_choice)
    assert "fold_scale" not in off.lower()
    assert ("fold_scale=FOLD_SCALE" in on) == folded
    assert without(on, "FOLD_SCALE", "fold_scale") == off
    if folded and mods == "causal":
        folded_choice.load()


def test_a_negative_scale_is_not_folded(graph):
    nodes, layout, subgraphs = flex_inputs(graph, mods=MODS["causal"])
    choices = []
    with config.patch(flex_fold_scale=True):
        assert flex_choices(choices, nodes, layout, subgraphs,
                            {**OPTIONS, "SM_SCALE": -0.125}) is None
    assert "FOLD_SCALE" not in choices[0].source


def test_one_huge_block_without_full_blocks_compiles(graph):
    """flex's "no mask" BlockMask: one block of 2**30, no full blocks (their tensors one
    unused element each, as ``inductor/flex.py`` makes them)."""
    nodes, layout, subgraphs = flex_inputs(graph)
    nodes[7] = make_input(graph, "no_full_num", (1,))
    nodes[8] = make_input(graph, "no_full_idx", (1,))
    choices = []
    options = {**OPTIONS, "SPARSE_Q_BLOCK_SIZE": 1 << 30, "SPARSE_KV_BLOCK_SIZE": 1 << 30,
               "HAS_FULL_BLOCKS": False}
    assert flex_choices(choices, nodes, layout, subgraphs, options) is None
    choices[0].load()


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("kv_batch", [B, 1])
def test_gqa_compiles(graph, head_dim, kv_batch):
    """GQA (2 KV heads for 4) and a broadcast KV batch, both head dims: K's and V's
    TMA tensors stay within TMA's 5 dimensions."""
    nodes, layout, subgraphs = flex_inputs(graph, head_dim=head_dim, kv_heads=2,
                                           kv_batch=kv_batch, mods=MODS["causal"])
    choices = []
    assert flex_choices(choices, nodes, layout, subgraphs, OPTIONS) is None
    choices[0].load()


@pytest.mark.parametrize("kwargs, options, reason", [
    (dict(head_dim=32), {}, "head dims q/k 32/32, v 32"),
    (dict(v_head_dim=128), {}, "head dims q/k 64/64, v 128"),
    (dict(dtype=torch.float32), {}, "dtype torch.float32"),
    (dict(kv_heads=3), {}, "q heads 4 / kv heads 3"),
    ({}, dict(SPARSE_Q_BLOCK_SIZE=64), "no config fits the BlockMask's blocks"),
])
def test_refusals_say_why(graph, kwargs, options, reason):
    nodes, layout, subgraphs = flex_inputs(graph, **kwargs)
    choices = []
    assert reason in flex_choices(choices, nodes, layout, subgraphs, {**OPTIONS, **options})
    assert choices == []


def test_a_score_mod_that_does_not_translate_is_refused_with_template_and_params(graph):
    nodes, layout, subgraphs = flex_inputs(
        graph, mods=(lambda score, b, h, q, kv: torch.sin(score), None))
    choices = []
    reason = flex_choices(choices, nodes, layout, subgraphs, OPTIONS)
    assert choices == [] and "sm90_flex_attention" in reason and "BLOCK_N=" in reason
    assert "sin" in reason
