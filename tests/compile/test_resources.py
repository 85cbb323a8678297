"""A kernel's registers, shared memory and spills from real GPU-less compiles (sm_90a) of
the GEMM and of a kernel made to spill: ptxas' report and the dynamic shared memory of
CuTe DSL's launch."""

import pytest
import torch

from cutedsl_inductor import CuteDSLTemplate, config
from cutedsl_inductor.autotune.scratch import scratch_graph
from cutedsl_inductor.compile.compiler import entry_name
from cutedsl_inductor.compile.resources import compile_with_resources
from cutedsl_inductor.kernels.gemm import template
from cutedsl_inductor.runtime.loader import describe_kernel, import_source


def resources_of(choice):
    module, path = import_source(choice.source)
    describe = describe_kernel(choice.kernel, path)
    return compile_with_resources(getattr(module, entry_name(choice.name)), choice.specs,
                                  "sm_90a", describe)


def gemm_resources():
    with config.patch(arch="sm_90a", disk_cache=False), scratch_graph() as scratch:
        choice = template.precompile_choices(scratch, [(4096, 4096, 4096)])[0]
        (kernel,) = resources_of(choice)
    return kernel


def test_the_gemm_reports_its_registers_and_its_ring_of_shared_memory():
    kernel = gemm_resources()
    assert kernel.function.startswith("kernel_cutlass_kernel_cutedsl_inductorkernelsgemm")
    # a producer warp group and two consumers of 64 rows, each with its accumulators
    assert 128 <= kernel.registers <= 255 and kernel.barriers >= 1
    # the operand ring: its stages fill most of the 227 KiB an sm_90 block may have
    assert 100_000 < kernel.dynamic_smem_bytes <= 232_448
    assert kernel.spills is False and kernel.stack_bytes == 0


# every thread keeps VALUES floats live until their sum of products is known
PRESSURE = CuteDSLTemplate("resources_pressure", r'''
{{gen_defines()}}

@cute.kernel
def {{kernel_name}}_kernel(gA: cute.Tensor, gC: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = (bidx * 128 + tidx) * VALUES
    frag = cute.make_rmem_tensor((VALUES,), cutlass.Float32)
    for j in cutlass.range_constexpr(VALUES):
        frag[j] = gA[i + j]
    s = cutlass.Float32(0.0)
    for j in cutlass.range_constexpr(VALUES):
        s = s + frag[j] * frag[VALUES - 1 - j]
    for j in cutlass.range_constexpr(VALUES):
        gC[i + j] = frag[j] * s

@cute.jit
{{def_kernel("a")}}
    total = cute.size(a.shape)
    flat_a = cute.make_tensor(a.iterator, cute.make_layout(total))
    flat_c = cute.make_tensor({{get_output()}}.iterator, cute.make_layout(total))
    {{kernel_name}}_kernel(flat_a, flat_c).launch(grid=[total // (128 * VALUES), 1, 1],
                                                  block=[128, 1, 1], stream=stream)
''')


@pytest.mark.parametrize("values, spills", [(64, False), (512, True)])
def test_spills_are_reported(values, spills):
    """512 live floats a thread do not fit its registers: ptxas spills them (and CuTe DSL
    prints its report wrapped inside a remark)."""
    with config.patch(arch="sm_90a", disk_cache=False), scratch_graph() as scratch:
        a = scratch.input((1 << 20,), torch.float32)
        choice = PRESSURE.generate(input_nodes=[a], layout=a.get_layout(), VALUES=values)
        (kernel,) = resources_of(choice)
    assert kernel.spills is spills and kernel.dynamic_smem_bytes == 0
    if spills:
        assert kernel.spill_store_bytes > 0 and kernel.spill_load_bytes > 0
        assert kernel.stack_bytes >= values * 4
