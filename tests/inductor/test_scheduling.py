
import torch
from torch._inductor.codegen.common import IndentedBuffer, device_codegens, init_backend_registration

import cutedsl_inductor
from cutedsl_inductor.compile.specs import ScalarSpec, Sym, TensorSpec
from cutedsl_inductor.inductor.scheduling import CuteDSLCombinedScheduling, kernel_definition
from cutedsl_inductor.templates.elementwise import add_template
from tests.helpers import make_input, make_layout


def test_install_registers_our_scheduling_for_cuda_only():
    init_backend_registration()
    cutedsl_inductor.install()
    cutedsl_inductor.install()
    assert device_codegens["cuda"].scheduling is CuteDSLCombinedScheduling
    assert device_codegens["cpu"].scheduling is not CuteDSLCombinedScheduling


def test_output_code_embeds_the_source_byte_for_byte(graph):
    inputs = [make_input(graph, "arg0_1", (64, 128)), make_input(graph, "arg1_1", (64, 128))]
    choice = add_template.generate(input_nodes=inputs, layout=make_layout((64, 128)),
                                   THREADS=128, VECTOR=4)
    body = kernel_definition(choice.name, choice.source, choice.specs, "elementwise_add",
                             {"THREADS": 128, "DTYPE": torch.float16})
    header = IndentedBuffer()  # how Inductor's wrapper writes kernel definitions
    header.splice(f"\n\n# comment\n{choice.name} = {body}")
    namespace = {"load_kernel": lambda *args, **kwargs: (args, kwargs),
                 "TensorSpec": TensorSpec, "Sym": Sym, "ScalarSpec": ScalarSpec, "torch": torch}
    exec(compile(header.getvalue(), "output_code", "exec"), namespace)
    (name, source), kwargs = namespace[choice.name]
    assert name == choice.name and source == choice.source
    assert kwargs["specs"] == choice.specs
    assert kwargs["params"] == {"THREADS": 128, "DTYPE": torch.float16}


GRAPH = torch.fx.symbolic_trace(lambda x: x + 1)
EXAMPLE = [torch.ones(4)]


def fx_graph_cache_key():
    from torch._inductor.codecache import compiled_fx_graph_hash

    key, _ = compiled_fx_graph_hash(GRAPH, EXAMPLE, {}, [])
    return key


def test_fx_graph_cache_key_carries_our_versions(monkeypatch):
    from cutedsl_inductor.compile import compiler

    cutedsl_inductor.install()
    before = fx_graph_cache_key()
    assert fx_graph_cache_key() == before
    versions = {**compiler.toolchain_versions(), "cutedsl_inductor": "0.0.0-other"}
    monkeypatch.setattr(compiler, "toolchain_versions", lambda: versions)
    assert fx_graph_cache_key() != before
