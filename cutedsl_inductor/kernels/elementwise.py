"""Elementwise add: the smallest complete CuteDSL template, used by the demo and tests.

``ADD_SOURCE`` is written in our fast style: the entry is ``@cute.jit``, so it compiles
once with TVM-FFI and launches straight from torch tensors. Each thread adds
``VECTOR`` consecutive elements of the flattened, contiguous tensors; ``THREADS`` is
the block size. ``UPSTREAM_ADD_SOURCE`` is the same kernel in upstream PyTorch's style
(plain Python entry, ``from_dlpack`` and an explicit stream), kept to prove that such
templates run unchanged (and launch through TVM-FFI: ``compile/upstream.py``).

``add_choices`` appends one choice per (THREADS, VECTOR) pair; ``register_add_op``
defines the custom op ``cutedsl::add`` whose lowering autotunes those choices against
ATen's add. Both need contiguous inputs of one dtype and shape.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._inductor.select_algorithm import ExternKernelChoice

from ..autotune.select import autotune_select_algorithm
from ..template.template import CuteDSLTemplate

ADD_SOURCE = r'''
{{gen_defines()}}
{%- if has_epilogue %}

{{def_epilogue()}}
{%- endif %}

@cute.kernel
def {{kernel_name}}_kernel(gA: cute.Tensor, gB: cute.Tensor, gC: cute.Tensor, total: cutlass.Int32{% if has_epilogue %}, shape_rev, extras{% endif %}):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    base = (bidx * THREADS + tidx) * VECTOR
    for v in cutlass.range_constexpr(VECTOR):
        i = base + v
        if i < total:
{%- if has_epilogue %}
            crd = cute.idx2crd(i, shape_rev)
            value = {{kernel_name}}_epilogue(
                (gA[i] + gB[i]).to(cutlass.Float32),
                {% for d in range(output_rank)|reverse %}crd[{{d}}], {% endfor %}extras)
            gC[i] = value.to(gC.element_type)
{%- else %}
            gC[i] = gA[i] + gB[i]
{%- endif %}


@cute.jit
{{def_kernel("a", "b")}}
    flat_a = cute.make_tensor(a.iterator, cute.make_layout(cute.size(a.shape)))
    flat_b = cute.make_tensor(b.iterator, cute.make_layout(cute.size(b.shape)))
    flat_c = cute.make_tensor({{get_output()}}.iterator, cute.make_layout(cute.size(a.shape)))
    total = cute.size(a.shape)
    per_block = THREADS * VECTOR
    {{kernel_name}}_kernel(flat_a, flat_b, flat_c, total{% if has_epilogue %},
        tuple(reversed({{get_output()}}.shape)), {{epilogue_inputs()}}{% endif %}).launch(
        grid=[(total + per_block - 1) // per_block, 1, 1],
        block=[THREADS, 1, 1],
        stream=stream,
    )
'''

UPSTREAM_ADD_SOURCE = r'''
{{gen_defines()}}

@cute.kernel
def {{kernel_name}}_kernel(gA: cute.Tensor, gB: cute.Tensor, gC: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    bdim, _, _ = cute.arch.block_dim()

    thread_idx = bidx * bdim + tidx
    m, n = gA.shape

    if thread_idx < m * n:
        mi = thread_idx // n
        ni = thread_idx % n

        if mi < m and ni < n:
            gC[mi, ni] = gA[mi, ni] + gB[mi, ni]

@cute.jit
def {{kernel_name}}_jit(mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, stream):
    {{gen_defines()}}
    m, n = mA.shape
    total_threads = m * n
    num_blocks = (total_threads + THREADS_PER_BLOCK - 1) // THREADS_PER_BLOCK

    kernel = {{kernel_name}}_kernel(mA, mB, mC)
    kernel.launch(
        grid=[num_blocks, 1, 1],
        block=[THREADS_PER_BLOCK, 1, 1],
        stream=stream
    )

{{def_kernel("input_a", "input_b")}}
    cute_a = from_dlpack(input_a)
    cute_b = from_dlpack(input_b)
    cute_c = from_dlpack({{get_output()}})

    {{kernel_name}}_jit(cute_a, cute_b, cute_c, cuda.CUstream(stream))
    return {{get_output()}}
'''

add_template = CuteDSLTemplate("elementwise_add", ADD_SOURCE)
# ATen's add as the fallback choice; made at import so that cached output code that
# calls it finds it registered
aten_add = ExternKernelChoice(torch.add, name="cutedsl_aten_add", has_out_variant=True)

DEFAULT_ADD_CONFIGS = ({"THREADS": 128, "VECTOR": 4}, {"THREADS": 256, "VECTOR": 4},
                       {"THREADS": 512, "VECTOR": 8})


def add_choices(choices: list[Any], a: Any, b: Any, layout: Any,
                configs: tuple[dict[str, int], ...] = DEFAULT_ADD_CONFIGS) -> None:
    """Append the add template's choices; none unless a, b and the output are contiguous
    tensors of one shape and dtype."""
    layouts = (a.get_layout(), b.get_layout(), layout)
    if not all(lay.is_contiguous() for lay in layouts):
        return
    if len({lay.dtype for lay in layouts}) != 1 or len({tuple(lay.size) for lay in layouts}) != 1:
        return
    for params in configs:
        add_template.maybe_append_choice(choices, input_nodes=[a, b], layout=layout, **params)


@torch.library.custom_op("cutedsl::add", mutates_args=())
def cutedsl_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a + b


@cutedsl_add.register_fake
def _(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(a)


def lower_add(a: Any, b: Any) -> Any:
    """Inductor lowering of ``cutedsl::add``: the template's choices and ATen's add."""
    from torch._inductor import ir

    a, b = (ir.ExternKernel.require_contiguous(n) for n in (a, b))
    layout = ir.FixedLayout(a.get_device(), a.get_dtype(), a.get_size())
    choices: list[Any] = [aten_add.bind([a, b], layout)]
    add_choices(choices, a, b, layout)
    return autotune_select_algorithm("cutedsl_add", choices, [a, b], layout)


def register_add_op() -> None:
    """Lower ``torch.ops.cutedsl.add`` with ``lower_add`` (idempotent)."""
    from torch._inductor.lowering import lowerings, register_lowering

    if torch.ops.cutedsl.add.default not in lowerings:
        register_lowering(torch.ops.cutedsl.add.default)(lower_add)


def precompile_choices(scratch: Any) -> list[Any]:
    """The default choices for 2-D contiguous inputs of each supported dtype."""
    choices: list[Any] = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        a, b = scratch.input((1024, 1024), dtype), scratch.input((1024, 1024), dtype)
        add_choices(choices, a, b, a.get_layout())
    return choices
