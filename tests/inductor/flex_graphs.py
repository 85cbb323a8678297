"""flex_attention's forward lowered on a virtual sm_90, for the CPU tests of our flex
choices (``test_flex.py``) and of their launch from the C++ wrapper (``test_cpp_launch.py``).

The graphs are traced with make_fx on fake CUDA tensors (the BlockMask made on the CPU,
its tensors graph inputs). Two stand-ins for what a CPU-only torch lacks: the flex HOP's
fake implementation copies into a restrided output (a copy this build cannot dispatch
for "cuda": the fake output is restrided without it), and Triton is not installed, so
the Triton template makes no choice (as if Inductor's name filter left only ours)."""

import importlib

import torch
from torch._inductor.debug import DebugContext
from torch._inductor.decomposition import select_decomp_table
from torch._inductor.graph import GraphLowering
from torch._inductor.ir import get_fill_order
from torch._inductor.select_algorithm import TritonTemplate
from torch._inductor.virtualized import V
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.nn.attention.flex_attention import (
    _apply_kernel_options,
    _create_empty_block_mask,
    create_block_mask,
)

from cutedsl_inductor import config
from tests.helpers import use_virtual_sm90

HOP_MODULE = importlib.import_module("torch._higher_order_ops.flex_attention")
FLEX_MODULE = importlib.import_module("torch._inductor.kernel.flex.flex_attention")
B, H, S, D = 2, 4, 200, 64
OURS = "cutedsl_sm90_flex_attention"


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _restrided(out, query_strides):
    order = list(get_fill_order(query_strides))
    strides = HOP_MODULE._construct_strides(out.shape, order)
    if strides[-1] != 1:
        order.remove(len(out.shape) - 1)
        strides = HOP_MODULE._construct_strides(out.shape, [len(out.shape) - 1, *order])
    return out.new_empty_strided(out.shape, strides)


def use_virtual_flex(monkeypatch):
    """The virtual sm_90 and the stand-ins above for the rest of the test; one config (no
    persistent twin)."""
    use_virtual_sm90(monkeypatch)
    monkeypatch.setattr(HOP_MODULE, "_permute_strides", _restrided)
    monkeypatch.setattr(TritonTemplate, "maybe_append_choice", lambda self, choices, **kw: None)
    monkeypatch.setattr(config, "flex_max_configs", 1)
    monkeypatch.setattr(config, "flex_persistent", "off")


def lower(options, dtype=torch.bfloat16, score_mod=None, captured=(), head_dim=D, masked=True,
          cpp_wrapper=False, aot_mode=False, produced=False):
    """The output code of flex_attention(q, k, v) with a causal BlockMask (``masked``;
    else flex's "no mask" one) and ``options`` as kernel_options; ``captured``: (shape,
    dtype) of score_mod's extra inputs (graph inputs, passed as the HOP's
    score_mod_other_buffers; ``produced``: computed in the graph from them instead, as
    ``2 * x + 1``). With ``cpp_wrapper`` (``aot_mode``: AOTInductor's), the
    C++ wrapper's code and its additional files instead."""
    if masked:
        block_mask = create_block_mask(causal, B, H, S, S, device="cpu")
    else:
        block_mask = _create_empty_block_mask(torch.empty(B, H, S, D), torch.empty(B, H, S, D))
    parts = block_mask.as_tuple()
    where = [i for i, p in enumerate(parts) if isinstance(p, torch.Tensor)]
    score_mod = score_mod or (lambda score, b, h, m, n: score)

    def fn(q, k, v, *tensors):
        mask_tensors, extra = tensors[:len(where)], tensors[len(where):]
        if produced:
            extra = tuple(2 * x + 1 for x in extra)
        parts_here = list(parts)
        for i, t in zip(where, mask_tensors):
            parts_here[i] = t
        kernel_options = _apply_kernel_options(q, k, v, True, dict(options))
        out, lse, _ = HOP_MODULE.flex_attention(q, k, v, score_mod, tuple(parts_here), 0.125,
                                                kernel_options, tuple(extra), ())
        return out, lse

    mode = FakeTensorMode()
    with mode:
        args = [torch.empty((B, H, S, head_dim), device="cuda", dtype=dtype) for _ in range(3)]
        args += [torch.empty_strided(parts[i].shape, parts[i].stride(), dtype=parts[i].dtype,
                                     device="cuda") for i in where]
        args += [torch.empty(shape, device="cuda", dtype=dt) for shape, dt in captured]
    gm = make_fx(fn, decomposition_table=select_decomp_table(), tracing_mode="fake")(*args)
    graph = GraphLowering(gm, example_inputs=args, cpp_wrapper=cpp_wrapper or aot_mode,
                          aot_mode=aot_mode)
    with torch._inductor.config.patch(cpp_wrapper=cpp_wrapper or aot_mode), \
            V.set_graph_handler(graph), V.set_debug_handler(DebugContext()), \
            V.set_fake_mode(mode):
        graph.run(*args)
        code = graph.codegen()[0].value
        if not (cpp_wrapper or aot_mode):
            return code
        return code, list(graph.wrapper_code.additional_files)
