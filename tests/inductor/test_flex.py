"""flex_attention's lowering on a virtual sm_90 offers our FlexAttention choice when
switched on (kernel option or knob), compiles it into the output code, and offers
nothing when off (the graphs and stand-ins: ``tests/inductor/flex_graphs.py``)."""

import logging
import types

import pytest
import torch
from torch._inductor.select_algorithm import TritonTemplate

from cutedsl_inductor import config
from cutedsl_inductor.inductor import flex
from tests.helpers import TORCH, kernel_definitions, load_kernels
from tests.inductor.flex_graphs import FLEX_MODULE, H, OURS, lower, use_virtual_flex


@pytest.fixture
def virtual_flex(monkeypatch):
    use_virtual_flex(monkeypatch)


def our_kernels(code):
    return [d for d in kernel_definitions(code) if d.targets[0].id.startswith(OURS)]


def test_the_kernel_option_offers_and_compiles_our_choice(virtual_flex):
    code = lower({"CUTEDSL": True})
    ours = our_kernels(code)
    assert len(ours) == 1
    name = ours[0].targets[0].id
    # q, k, v, lse, max, the BlockMask's four tensors, out
    assert f"{name}.run(arg0_1, arg1_1, arg2_1, buf0, buf1, arg3_1, arg4_1, arg5_1, " in code
    load_kernels(ours)  # compiles for sm_90a


def test_the_knob_offers_it_for_every_call_with_captured_tensors(virtual_flex, monkeypatch):
    monkeypatch.setattr(config, "flex_attention", True)

    def alibi(score, b, h, q_idx, kv_idx, slopes):
        return score + slopes[h] * (kv_idx - q_idx)

    code = lower({}, score_mod=alibi, captured=[((H,), torch.float32)])
    ours = our_kernels(code)
    assert len(ours) == 1
    assert "captures[0][" in ours[0].value.args[1].value  # the slopes, read by the kernel
    load_kernels(ours)


@pytest.mark.skipif(TORCH < (2, 15), reason="torch 2.11-2.14 autotune flex on the "
                    "realized capture, which the subgraph does not read (docs/torch-versions.md)")
def test_a_captured_tensor_computed_in_the_graph_is_read_through_its_producer(
        virtual_flex, monkeypatch):
    """The score_mod's subgraph inlines the capture's producer: our kernel reads the graph
    input it is computed from (torch 2.15 autotunes flex on the buffers the subgraphs read;
    without a Triton choice ours builds that list itself)."""
    monkeypatch.setattr(config, "flex_attention", True)

    def alibi(score, b, h, q_idx, kv_idx, slopes):
        return score + slopes[h] * (kv_idx - q_idx)

    code = lower({}, score_mod=alibi, captured=[((H,), torch.float32)], produced=True)
    ours = our_kernels(code)
    assert len(ours) == 1
    source = ours[0].value.args[1].value
    assert "captures[0][" in source and "cutlass.Float32(2.0)" in source
    assert ", arg11_1, buf" in code  # the slopes' graph input, after the BlockMask's tensors
    load_kernels(ours)


def test_no_mask_walks_one_huge_block_as_the_tiles_of_kv_len(virtual_flex):
    """flex's "no mask" BlockMask is one block of 2**30 without full blocks: the unused
    full-block tensors come as one element each, not empty (no CuTe layout has a
    0 extent), and the kernel walks only the tiles of KV_LEN
    (``Sm90FlexAttention.steps_per_block``)."""
    code = lower({"CUTEDSL": True}, masked=False)
    ours = our_kernels(code)
    assert len(ours) == 1
    source = ours[0].value.args[1].value
    assert "SPARSE_KV_BLOCK: cutlass.Constexpr = 1073741824" in source
    assert "HAS_FULL_BLOCKS: cutlass.Constexpr = False" in source
    assert code.count("empty_strided_cuda((1, ), (1, ), torch.float32)") == 2
    load_kernels(ours)


class Selected(Exception):
    pass


def spy_on_selection(monkeypatch):
    """Record the choices flex_attention's lowering autotunes over, then stop it."""
    seen = []

    def select(name, choices, *args, **kwargs):
        seen.append([c.name for c in choices])
        raise Selected

    monkeypatch.setattr(FLEX_MODULE, "autotune_select_algorithm", select)
    return seen


def test_switched_off_nothing_is_offered_and_nothing_is_wrapped(virtual_flex, monkeypatch):
    seen = spy_on_selection(monkeypatch)
    template = FLEX_MODULE.flex_attention_template
    with pytest.raises(Exception, match="Selected"):  # Inductor wraps it in a LoweringException
        lower({})
    assert seen == [[]]  # Triton's (none here) and not ours
    assert FLEX_MODULE.flex_attention_template is template


def test_a_refused_problem_names_the_template_its_params_and_the_reason(
        virtual_flex, monkeypatch, caplog):
    seen = spy_on_selection(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="cutedsl_inductor.inductor.flex"), \
            pytest.raises(Exception, match="Selected"):
        lower({"CUTEDSL": True}, dtype=torch.float32)
    assert seen == [[]]
    message = next(r.getMessage() for r in caplog.records if "no CuteDSL flex" in r.getMessage())
    assert "template sm90_flex_attention" in message and "'SM_SCALE': 0.125" in message
    assert "dtype torch.float32: the kernel takes bf16/fp16" in message


def triton_stand_in(monkeypatch):
    """The Triton template appends one stand-in choice per config (none are real here),
    on the input nodes it was given (torch 2.15's lowering autotunes on the first
    choice's; a real one adds the buffers its subgraphs read)."""
    monkeypatch.setattr(TritonTemplate, "maybe_append_choice", lambda self, choices, **kw:
                        choices.append(types.SimpleNamespace(
                            name="triton_stand_in", input_nodes=list(kw["input_nodes"]))))


def test_only_ours_drops_the_triton_choices(virtual_flex, monkeypatch):
    triton_stand_in(monkeypatch)
    seen = spy_on_selection(monkeypatch)
    with pytest.raises(Exception, match="Selected"):
        lower({"CUTEDSL": True})
    assert "triton_stand_in" in seen[0] and len(seen[0]) == 2  # Triton's and ours
    monkeypatch.setattr(config, "flex_only_ours", True)
    with pytest.raises(Exception, match="Selected"):
        lower({"CUTEDSL": True})
    assert len(seen[1]) == 1 and seen[1] != ["triton_stand_in"]


def test_only_ours_fails_the_compile_with_the_reason_where_ours_is_refused(
        virtual_flex, monkeypatch):
    triton_stand_in(monkeypatch)
    seen = spy_on_selection(monkeypatch)
    monkeypatch.setattr(config, "flex_only_ours", True)
    with pytest.raises(Exception, match="dtype torch.float32: the kernel takes bf16/fp16"):
        lower({"CUTEDSL": True}, dtype=torch.float32)
    assert seen == []  # no autotuning over Triton's choices
    with pytest.raises(Exception, match="Selected"):  # ours switched off: Triton's as ever
        lower({}, dtype=torch.float32)
    assert seen == [["triton_stand_in"]]


def test_our_option_is_removed_before_inductor_sees_it():
    args = (1, 2, 3, 4, 5, 6, {"CUTEDSL": True, "BACKEND": "AUTO"})
    stripped, kwargs, asked = flex._split_options(args, {})
    assert asked and stripped[6] == {"BACKEND": "AUTO"} and kwargs == {}
    _, kwargs, asked = flex._split_options((), {"kernel_options": {"CUTEDSL": False}})
    assert not asked and kwargs == {"kernel_options": {}}


def test_options_not_where_expected_leave_the_arguments_alone(caplog):
    """A torch whose HOP had moved its kernel_options: Inductor's lowering runs unchanged."""
    args = (*range(6), None, "fw", "joint", (), 0.125, {"CUTEDSL": True}, (), ())
    with caplog.at_level("WARNING", logger=flex.__name__):
        same, kwargs, asked = flex._split_options(args, {})  # argument 6 is grad_logsumexp
    assert same == args and kwargs == {} and not asked
    assert "no kernel_options mapping at argument 6 (found NoneType)" in caplog.text


def test_install_wraps_the_flex_lowerings_once():
    from torch._inductor.lowering import lowerings

    forward = lowerings[torch.ops.higher_order.flex_attention]
    assert forward._cutedsl_flex
    flex.install_flex()
    assert lowerings[torch.ops.higher_order.flex_attention] is forward
    assert lowerings[torch.ops.higher_order.flex_attention_backward]._cutedsl_flex


def test_the_backward_options_are_argument_11():
    """flex_attention_backward's kernel_options come after grad_logsumexp (often None),
    the graphs, the BlockMask and the scale."""
    args = (*range(6), None, "fw", "joint", (), 0.125, {"CUTEDSL": True}, (), ())
    stripped, _, asked = flex._split_options(args, {}, flex._BACKWARD_OPTIONS_ARG)
    assert asked and stripped[11] == {} and stripped[6] is None


def test_the_backward_lowering_hands_our_backward_its_subgraphs_and_options(monkeypatch):
    """Under the backward lowering, the Triton template's first maybe_append_choice hands
    over the subgraphs and kernel options; "flex_attention_backward"'s autotuning gets
    our choices on the same input nodes and layout (what the Triton one returns is
    passed through)."""
    import types

    from cutedsl_inductor.kernels.attention import bwd_template

    calls = []
    monkeypatch.setattr(bwd_template, "flex_bwd_choices",
                        lambda *args: calls.append(args) or None)
    triton = types.SimpleNamespace(maybe_append_choice=lambda *a, **kw: None)
    module = types.SimpleNamespace(flex_attention_backward_template=triton,
                                   autotune_select_algorithm=lambda *a, **kw: ("node", None))
    offer = flex._Offer(module, "flex_attention_backward")
    with offer.patched():
        module.flex_attention_backward_template.maybe_append_choice(
            choices=[], subgraphs=["fw", "joint", "mask", []], SM_SCALE=0.125,
            SPARSE_Q_BLOCK_SIZE=128, SPARSE_KV_BLOCK_SIZE=128, HAS_FULL_BLOCKS=True)
        assert module.autotune_select_algorithm("flex_attention_backward", ["triton"],
                                                ["q", "k"], "layout") == ("node", None)
    assert module.flex_attention_backward_template is triton
    (choices, nodes, layout, subgraphs, options), = calls
    assert choices == ["triton"] and nodes == ["q", "k"] and layout == "layout"
    assert subgraphs == ["fw", "joint", "mask", []]
    assert options == {"SM_SCALE": 0.125, "SPARSE_Q_BLOCK_SIZE": 128,
                       "SPARSE_KV_BLOCK_SIZE": 128, "HAS_FULL_BLOCKS": True}
