import ast

import torch
from torch._inductor.codegen.common import (
    IndentedBuffer,
    device_codegens,
    init_backend_registration,
)

import cutedsl_inductor
from cutedsl_inductor.compile.records import KernelSource
from cutedsl_inductor.compile.specs import ScalarSpec, Sym, TensorSpec
from cutedsl_inductor.inductor.combined import CuteDSLCombinedScheduling
from cutedsl_inductor.inductor.install import cuda_scheduling
from cutedsl_inductor.inductor.scheduling import kernel_definition
from cutedsl_inductor.kernels.elementwise import add_template
from tests.helpers import (
    kernel_definitions,
    load_kernels,
    lowered,
    make_input,
    make_layout,
    virtual_sm90_max_autotune,
)


def test_install_registers_our_scheduling_for_cuda_only():
    # the package's import registered it before torch's registration, which keeps it
    init_backend_registration()
    assert device_codegens["cuda"].scheduling is cuda_scheduling
    cutedsl_inductor.install()
    cutedsl_inductor.install()
    assert device_codegens["cuda"].scheduling is cuda_scheduling
    assert isinstance(device_codegens["cuda"].scheduling(None), CuteDSLCombinedScheduling)
    assert not isinstance(device_codegens["cpu"].scheduling(None), CuteDSLCombinedScheduling)


def test_output_code_embeds_the_source_byte_for_byte(graph):
    inputs = [make_input(graph, "arg0_1", (64, 128)), make_input(graph, "arg1_1", (64, 128))]
    choice = add_template.generate(input_nodes=inputs, layout=make_layout((64, 128)),
                                   THREADS=128, VECTOR=4)
    kernel = KernelSource.of(choice.name, choice.source, choice.specs, "elementwise_add",
                             {"THREADS": 128, "DTYPE": torch.float16})
    body = kernel_definition(kernel)
    header = IndentedBuffer()  # how Inductor's wrapper writes kernel definitions
    header.splice(f"\n\n# comment\n{choice.name} = {body}")
    namespace = {"load_kernel": lambda *args, **kwargs: (args, kwargs),
                 "TensorSpec": TensorSpec, "Sym": Sym, "ScalarSpec": ScalarSpec, "torch": torch}
    exec(compile(header.getvalue(), "output_code", "exec"), namespace)
    (name, source), kwargs = namespace[choice.name]
    assert name == choice.name and source == choice.source
    assert kwargs["specs"] == list(choice.specs)
    assert kwargs["params"] == {"THREADS": 128, "DTYPE": torch.float16}
    # what the output code's load_kernel wraps is the record that was written
    assert KernelSource.of(name, source, kwargs["specs"], kwargs["template"],
                           kwargs["params"]) == kernel


def specs_of(definition):
    from cutedsl_inductor.compile.specs import ScalarSpec, Sym, TensorSpec

    (specs,) = [k.value for k in definition.value.keywords if k.arg == "specs"]
    return eval(compile(ast.Expression(specs), "specs", "eval"),
                {"TensorSpec": TensorSpec, "Sym": Sym, "ScalarSpec": ScalarSpec})


def unit_stride_dims(specs):
    return [tuple(d for d, s in enumerate(spec.stride) if s == 1) for spec in specs
            if isinstance(spec, TensorSpec)]


def test_gemms_whose_operands_differ_in_layout_get_a_kernel_each(monkeypatch):
    """One shape, one config (one rendered text), two layouts of B: two binaries, so two
    kernels in the output code, each called with the layouts it was compiled for."""
    with virtual_sm90_max_autotune(monkeypatch, "CUTEDSL", gemm_max_configs=1), \
            lowered(lambda x, w: (x @ w, x @ w.t()), (256, 256), (256, 256)) as graph:
        code = graph.codegen()[0].value
    definitions = kernel_definitions(code)
    assert len(definitions) == 2
    assert sorted(map(unit_stride_dims, map(specs_of, definitions))) == [
        [(1,), (0,), (1,)], [(1,), (1,), (1,)]]
    names = [d.targets[0].id for d in definitions]
    assert all(f"{name}.run(" in code for name in names)
    load_kernels(definitions)  # both compile (GPU-less, sm_90a)


def test_backward_gemms_compile_with_the_layouts_they_are_called_with(monkeypatch):
    """A linear chain's forward and backward GEMMs (as AOT autograd writes them: the
    gradients and activations transposed) at one size: one kernel per layout pairing,
    shared by the calls of that pairing."""
    def forward_backward(x, w1, w2, grad):
        h = x @ w1.t()
        grad_h = grad @ w2
        return h @ w2.t(), grad.t() @ h, grad_h.t() @ x, grad_h @ w1

    with virtual_sm90_max_autotune(monkeypatch, "CUTEDSL", gemm_max_configs=1), \
            lowered(forward_backward, *[(256, 256)] * 4) as graph:
        code = graph.codegen()[0].value
    definitions = kernel_definitions(code)
    layouts = sorted(unit_stride_dims(specs_of(d)) for d in definitions)
    # A and B row-major / B transposed / A transposed: (a, b, out) unit-stride dims
    assert layouts == [[(0,), (1,), (1,)], [(1,), (0,), (1,)], [(1,), (1,), (1,)]]
    assert sum(code.count(f"{d.targets[0].id}.run(") for d in definitions) == 6
    load_kernels(definitions)


WORKSPACE_SOURCE = r'''
{{gen_defines()}}

@cute.kernel
def {{kernel_name}}_kernel(gA: cute.Tensor, gW: cute.Tensor, gC: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * 128 + tidx
    gC[i] = gA[i] + gW[i]

@cute.jit
{{def_kernel("a")}}
    {{kernel_name}}_kernel(a, {{get_workspace()}}, {{get_output()}}).launch(
        grid=[SIZE // 128, 1, 1], block=[128, 1, 1], stream=stream)
'''


def register_plus_scratch():
    """``cutedsl_test::plus_scratch``: lowered to one choice of a template with a zeroed
    float32 workspace of 1024 elements."""
    from torch._inductor.lowering import lowerings, register_lowering

    from cutedsl_inductor import autotune_select_algorithm
    from cutedsl_inductor.compile.specs import Workspace
    from cutedsl_inductor.template.template import CuteDSLTemplate

    template = CuteDSLTemplate("test_workspace_add", WORKSPACE_SOURCE)
    if not hasattr(torch.ops.cutedsl_test, "plus_scratch"):
        @torch.library.custom_op("cutedsl_test::plus_scratch", mutates_args=())
        def plus_scratch(a: torch.Tensor) -> torch.Tensor:
            return a.clone()

        plus_scratch.register_fake(lambda a: torch.empty_like(a))
    op = torch.ops.cutedsl_test.plus_scratch.default
    if op not in lowerings:
        @register_lowering(op)
        def lower(a):
            choices = []
            template.maybe_append_choice(choices, input_nodes=[a], layout=a.get_layout(),
                                         workspace=Workspace(1024, "float32"), SIZE=1024)
            return autotune_select_algorithm("plus_scratch", choices, [a], a.get_layout())


def test_a_workspace_is_allocated_zeroed_passed_and_freed_by_the_output_code(monkeypatch):
    """A template choice with a workspace: the output code allocates it right before the
    call (zeroed: ``.zero_()``), passes it after the output, frees it after the call, and
    the kernel compiles with it (GPU-less)."""
    from tests.helpers import use_virtual_sm90

    register_plus_scratch()
    use_virtual_sm90(monkeypatch)
    with lowered(lambda a: torch.ops.cutedsl_test.plus_scratch(a), (1024,),
                 dtype=torch.float32) as graph:
        code = graph.codegen()[0].value
    (definition,) = kernel_definitions(code)
    name = definition.targets[0].id
    lines = [line.strip() for line in code.splitlines()]
    start = lines.index("workspace_0 = empty_strided_cuda((1024, ), (1, ), torch.float32)")
    assert lines[start + 1] == "workspace_0.zero_()"
    call = next(i for i, line in enumerate(lines) if line.startswith(f"{name}.run("))
    assert lines[call].startswith(f"{name}.run(a_1, buf0, workspace_0, stream=")
    assert start < call < lines.index("del workspace_0")
    assert specs_of(definition)[-1] == TensorSpec("float32", (1024,), (1,), 16)
    load_kernels([definition])
