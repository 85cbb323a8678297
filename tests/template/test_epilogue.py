"""Fused epilogues rendered into the add and GEMM templates and compiled GPU-less (sm_90a),
built from real Inductor lowerings of the consumers."""

import pytest
import torch
import tvm_ffi
from torch._inductor.lowering import lowerings

from cutedsl_inductor.compile.specs import specs_for_nodes
from cutedsl_inductor.kernels.elementwise import add_template
from cutedsl_inductor.kernels.gemm.template import gemm_choices
from cutedsl_inductor.runtime.loader import load_kernel
from cutedsl_inductor.template.epilogue import plan_epilogue
from cutedsl_inductor.template.kernel import name_kernel
from tests.helpers import make_input, make_layout

aten = torch.ops.aten


def realized(box):
    """The buffer a lowering's result becomes, its layout decided (as when scheduled)."""
    box.realize()
    box.data.data.freeze_layout()
    return box.data.data


def compile_fused(choice, template_buffer, consumers):
    """Render the chosen template with ``consumers`` fused and compile it."""
    plan = plan_epilogue(template_buffer, consumers)
    kernel, render = choice.make_kernel_render(template_buffer, epilogue=plan)
    rendered = render()
    specs = specs_for_nodes(kernel.arg_nodes(), choice.template.symbolic_shapes)
    name, source = name_kernel(choice.template.name, rendered, specs)
    wrapper = load_kernel(name, source, specs)
    assert isinstance(wrapper.kernel_fn, tvm_ffi.Function), type(wrapper.kernel_fn)
    return plan, source


def add_output(graph, shape=(64, 128), dtype=torch.float32):
    a, b = make_input(graph, "a", shape, dtype), make_input(graph, "b", shape, dtype)
    choice = add_template.generate(input_nodes=[a, b], layout=make_layout(shape, dtype),
                                   THREADS=128, VECTOR=4)
    out = choice.output_node()
    return choice, out, realized(out)


def test_relu_fuses_into_the_add_template(graph):
    choice, out, template_buffer = add_output(graph)
    relu = realized(lowerings[aten.relu.default](out))
    plan, source = compile_fused(choice, template_buffer, [relu])
    assert plan.output is relu and plan.fused_names == [template_buffer.get_name()]
    assert "cute.math.max(" in source and plan.extra_buffers == []


def test_scale_plus_residual_and_bias_read_extra_inputs(graph):
    choice, out, template_buffer = add_output(graph)
    residual = make_input(graph, "residual", (64, 128))
    bias = make_input(graph, "bias", (128,))
    scaled = realized(lowerings[aten.mul.Tensor](out, 0.5))
    total = realized(lowerings[aten.add.Tensor](
        lowerings[aten.add.Tensor](scaled, residual), bias))
    plan, source = compile_fused(choice, template_buffer, [scaled, total])
    assert plan.extra_buffers == ["residual", "bias"]
    assert plan.fused_names == [template_buffer.get_name(), scaled.get_name()]


def test_float_inputs_load_ahead_and_a_bool_mask_inline(graph):
    """The load phase reads each distinct float element once into registers; a bool
    mask has no register fragment and is read where ``apply`` uses it."""
    choice, out, template_buffer = add_output(graph)
    residual = make_input(graph, "residual", (64, 128))
    mask = make_input(graph, "mask", (64, 128), torch.bool)
    add, mul = lowerings[aten.add.Tensor], lowerings[aten.mul.Tensor]
    kept = lowerings[aten.where.self](mask, add(out, residual), mul(residual, 2.0))
    plan, source = compile_fused(choice, template_buffer, [realized(kept)])
    assert plan.extra_buffers == ["mask", "residual"]
    assert [r.expr for r in plan.register_loads] == ["extras[1][c1 + 128*c0]"]
    pair = source.split("_epilogue_load_pair(")[1].split("@cute.jit")[0]
    assert "cute.assume(c1 + 128*c0, divby=2), cute.make_layout(2)).load()" in pair
    load = source.split("_epilogue_load(")[1].split("@cute.jit")[0]
    apply = source.split("_epilogue_apply(")[1].split("@cute.jit")[0]
    assert "loaded[0][i] = extras[1][c1 + 128*c0]" in load and "extras[0]" not in load
    assert "(extras[0][c1 + 128*c0]).to(cutlass.Boolean)" in apply and "extras[1]" not in apply


def test_pair_loads_of_inputs_not_contiguous_along_the_row_read_two_elements(graph):
    """A per-row vector (the same element for both columns) and an odd-offset view
    cannot be read as one aligned pair."""
    choice, out, template_buffer = add_output(graph)
    per_row = make_input(graph, "per_row", (64, 1))
    shifted = make_input(graph, "shifted", (64, 128), offset=1)
    add = lowerings[aten.add.Tensor]
    total = realized(add(add(out, per_row), shifted))
    plan, source = compile_fused(choice, template_buffer, [total])
    assert [r.contiguous for r in plan.register_loads] == [False, False]
    pair = source.split("_epilogue_load_pair(")[1].split("@cute.jit")[0]
    assert "loaded[0][i + 1] = extras[0][c0]" in pair
    assert "loaded[1][i + 1] = extras[1][2 + c1 + 128*c0]" in pair


def test_gelu_with_bias_fuses_into_the_gemm(graph):
    x = make_input(graph, "x", (256, 128), torch.bfloat16)
    w_t = make_input(graph, "w", (128, 384), torch.bfloat16, stride=(1, 128))
    bias = make_input(graph, "bias", (384,), torch.bfloat16)
    choices = []
    gemm_choices(choices, "mm", [x, w_t], make_layout((256, 384), torch.bfloat16))
    out = choices[0].output_node()
    template_buffer = realized(out)
    mul, add = lowerings[aten.mul.Tensor], lowerings[aten.add.Tensor]
    biased = add(out, bias)  # gelu as Inductor decomposes it: 0.5 x (1 + erf(x / sqrt 2))
    erf = lowerings[aten.erf.default](mul(biased, 0.7071067811865476))
    gelu = realized(mul(mul(biased, 0.5), add(erf, 1.0)))
    plan, source = compile_fused(choices[0], template_buffer, [gelu])
    assert plan.extra_buffers == ["bias"] and "cute.math.erf(" in source
    assert "_Gemm(Sm90Gemm)" in source


def gemm_output(graph):
    x = make_input(graph, "x", (256, 128), torch.bfloat16)
    w_t = make_input(graph, "w", (128, 384), torch.bfloat16, stride=(1, 128))
    choices = []
    gemm_choices(choices, "mm", [x, w_t], make_layout((256, 384), torch.bfloat16))
    out = choices[0].output_node()
    return choices[0], out, realized(out)


def test_a_residual_laid_out_like_the_output_is_a_gemm_tile_input(graph):
    """relu(x @ w + b) * 0.5 + residual: the residual, read at the output's own index in
    the output's dtype, comes by TMA into the GEMM's store buffers (``mTile``), its
    register loads left out of the pair loads; the bias stays a register load."""
    choice, out, template_buffer = gemm_output(graph)
    residual = make_input(graph, "residual", (256, 384), torch.bfloat16)
    bias = make_input(graph, "bias", (384,), torch.bfloat16)
    add, mul = lowerings[aten.add.Tensor], lowerings[aten.mul.Tensor]
    relu = lowerings[aten.relu.default](add(out, bias))
    block = realized(add(mul(relu, 0.5), residual))
    plan, source = compile_fused(choice, template_buffer, [block])
    tile = plan.register_loads[plan.tile_input]
    assert plan.extra_buffers[tile.extra] == "residual"
    assert "mTile=as_mnl(" in source and "def epilogue_tile_input" in source
    pair_loads = source.split("_load_pair(")[1].split("@cute.jit")[0]
    assert f"loaded[{plan.tile_input}]" not in pair_loads
    assert "loaded[" in pair_loads  # the bias's


@pytest.mark.parametrize("case", ["transposed", "float32"])
def test_other_residuals_stay_register_loads(graph, case):
    choice, out, template_buffer = gemm_output(graph)
    if case == "transposed":
        residual = lowerings[aten.permute.default](
            make_input(graph, "residual", (384, 256), torch.bfloat16), [1, 0])
    else:
        residual = make_input(graph, "residual", (256, 384), torch.float32)
    block = realized(lowerings[aten.add.Tensor](out, residual))
    plan, source = compile_fused(choice, template_buffer, [block])
    assert plan.tile_input is None and "mTile=" not in source


@pytest.mark.parametrize("case", ["transposed read", "other shape", "bool output"])
def test_unfusable_consumers_are_refused(graph, case):
    choice, out, template_buffer = add_output(graph, shape=(64, 64))
    if case == "transposed read":
        consumer = lowerings[aten.add.Tensor](out, lowerings[aten.permute.default](out, [1, 0]))
    elif case == "other shape":
        consumer = lowerings[aten.add.Tensor](
            lowerings[aten.slice.Tensor](out, 1, 0, 32), 1.0)
    else:
        consumer = lowerings[aten.gt.Scalar](out, 0.0)
    with pytest.raises(NotImplementedError):
        plan_epilogue(template_buffer, [realized(consumer)])


def test_indices_into_huge_extra_inputs_are_int64(graph):
    choice, out, template_buffer = add_output(graph, shape=(64, 128))
    small = make_input(graph, "small", (64, 128))
    huge = make_input(graph, "huge", (64, 128), stride=(2**26, 1))  # 2**32 elements of storage
    total = realized(lowerings[aten.add.Tensor](lowerings[aten.add.Tensor](out, small), huge))
    plan, source = compile_fused(choice, template_buffer, [total])
    assert "extras[0][c1 + 128*c0]" in source
    assert "extras[1][cutlass.Int64(c1) + 67108864*cutlass.Int64(c0)]" in source
