import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cutedsl_inductor import CuteDSLTemplate
from cutedsl_inductor.exc import (
    GeneratedCodeError,
    TemplateNameError,
    TemplateRegistryError,
    TemplateRenderError,
)
from cutedsl_inductor.kernels.elementwise import ADD_SOURCE
from tests.helpers import make_input, make_layout


def add_inputs(graph, shape=(64, 128)):
    return [make_input(graph, "arg0_1", shape), make_input(graph, "arg1_1", shape)]


def test_same_name_same_source_is_fine_other_source_is_an_error():
    first = CuteDSLTemplate("registry_probe", "{{def_kernel()}}\n    pass\n")
    again = CuteDSLTemplate("registry_probe", "{{def_kernel()}}\n    pass\n")
    assert again.source == first.source
    with pytest.raises(TemplateRegistryError, match="'registry_probe' is already registered"):
        CuteDSLTemplate("registry_probe", "{{def_kernel()}}\n    return 1\n")


def test_bad_jinja_is_a_clear_error():
    with pytest.raises(TemplateRenderError, match="'bad_jinja'.*line 2"):
        CuteDSLTemplate("bad_jinja", "ok\n{% if %}\n")


def test_render_error_is_returned_and_logged(graph, caplog):
    template = CuteDSLTemplate("undefined_var", "{{def_kernel('a', 'b')}}\n    x = {{NOPE}}\n")
    choices = []
    with caplog.at_level(logging.WARNING, logger="cutedsl_inductor"):
        err = template.maybe_append_choice(
            choices, input_nodes=add_inputs(graph), layout=make_layout((64, 128)), THREADS=64
        )
    assert isinstance(err, TemplateRenderError) and choices == []
    assert "'undefined_var'" in str(err) and "THREADS=64" in str(err) and "NOPE" in str(err)
    assert "undefined_var" in caplog.text and "THREADS=64" in caplog.text


def test_a_parameter_name_is_never_code(graph, tmp_path):
    marker = tmp_path / "ran"
    name = f"Z = 1\nimport os; os.system('touch {marker}')\nW"
    template = CuteDSLTemplate("named_params", ADD_SOURCE)
    choices = []
    err = template.maybe_append_choice(choices, input_nodes=add_inputs(graph),
                                       layout=make_layout((64, 128)), THREADS=64, VECTOR=4,
                                       **{name: 1})
    assert isinstance(err, TemplateRenderError) and choices == []
    assert "is not a Python identifier" in str(err) and not marker.exists()


@pytest.mark.parametrize("name", [
    "x_main(a, b, c, d): pass\nimport os; os.system('touch {marker}')\ndef y",
    "élément_add", "my-add", "9lives", ""])
def test_a_template_name_is_an_ascii_identifier_or_refused_at_construction(graph, tmp_path,
                                                                           name):
    """A name goes into the kernels' names: code in it would run when the kernel's module
    loads, a non-ASCII one fails in NVVM without the cause."""
    marker = tmp_path / "ran"
    name = name.format(marker=marker)
    with pytest.raises(TemplateNameError, match="must be an ASCII Python identifier"):
        template = CuteDSLTemplate(name, ADD_SOURCE)
        template.generate(input_nodes=add_inputs(graph), layout=make_layout((64, 128)),
                          THREADS=64, VECTOR=4).load()
    assert name not in CuteDSLTemplate.all_templates and not marker.exists()


def test_invalid_python_names_the_generated_file(graph, caplog):
    template = CuteDSLTemplate("bad_python", "{{def_kernel('a', 'b')}}\n    return (\n")
    choices = []
    with caplog.at_level(logging.WARNING, logger="cutedsl_inductor"):
        err = template.maybe_append_choice(
            choices, input_nodes=add_inputs(graph), layout=make_layout((64, 128)), STAGES=3
        )
    assert isinstance(err, GeneratedCodeError)
    path = err.fields["path"]
    assert "STAGES=3" in str(err) and path in str(err) and path in caplog.text
    assert "return (" in Path(path).read_text()


def test_no_choice_under_the_cpp_wrapper():
    import torch.fx
    from torch._inductor.graph import GraphLowering
    from torch._inductor.virtualized import V

    from cutedsl_inductor.exc import ChoiceError

    cpp_graph = GraphLowering(torch.fx.symbolic_trace(lambda x: x), cpp_wrapper=True)
    choices = []
    with V.set_graph_handler(cpp_graph):
        err = CuteDSLTemplate("cpp_wrapper_add", ADD_SOURCE).maybe_append_choice(
            choices, input_nodes=add_inputs(cpp_graph), layout=make_layout((64, 128)),
            THREADS=128, VECTOR=4)
    assert isinstance(err, ChoiceError) and choices == []
    assert "'cpp_wrapper_add'" in str(err) and "C++ wrapper" in str(err)


def test_choice_describes_itself(graph):
    template = CuteDSLTemplate("describe_add", ADD_SOURCE)
    choices = []
    assert template.maybe_append_choice(
        choices, input_nodes=add_inputs(graph), layout=make_layout((64, 128)),
        THREADS=128, VECTOR=4,
    ) is None
    (choice,) = choices
    assert choice.name.startswith("cutedsl_describe_add_")
    assert "THREADS=128" in choice.description
    assert choice.info_dict()["backend"] == "CuteDSL"
    assert choice.output_node().data.data.template is template


HASH_SCRIPT = textwrap.dedent("""
    import torch, torch.fx
    from torch._inductor.graph import GraphLowering
    from torch._inductor.virtualized import V
    from cutedsl_inductor import CuteDSLTemplate
    from cutedsl_inductor.kernels.elementwise import ADD_SOURCE
    from tests.helpers import make_input, make_layout
    template = CuteDSLTemplate("hash_probe", ADD_SOURCE)
    g = GraphLowering(torch.fx.symbolic_trace(lambda x: x))
    with V.set_graph_handler(g):
        inputs = [make_input(g, "arg0_1", (64, 128)), make_input(g, "arg1_1", (64, 128))]
        for threads in (128, 256):
            choice = template.generate(input_nodes=inputs, layout=make_layout((64, 128)),
                                       THREADS=threads, VECTOR=4)
            print(choice.hash_key())
""")


def test_hash_key_is_the_same_in_every_process():
    root = Path(__file__).resolve().parents[2]
    runs = [
        subprocess.run([sys.executable, "-c", HASH_SCRIPT], cwd=root, capture_output=True,
                       text=True, check=True).stdout.split()
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
    assert len(set(runs[0])) == 2


def test_benchmark_tensors_become_the_choice_views(graph):
    import torch
    from torch._inductor import ir

    w = make_input(graph, "w", (384, 256), torch.bfloat16)
    w_t = ir.ReinterpretView(data=w.data.data, layout=ir.FixedLayout(
        torch.device("cuda", 0), torch.bfloat16, [256, 384], stride=[1, 256]))
    x = make_input(graph, "x", (100, 256), torch.bfloat16)
    template = CuteDSLTemplate("views_probe", "{{def_kernel('a', 'b')}}\n    pass\n")
    choice = template.generate(input_nodes=[x, w_t],
                               layout=make_layout((100, 384), torch.bfloat16))
    base_x, base_w = torch.randn(100, 256), torch.randn(384, 256)
    a, b = choice.views_of((base_x, base_w))
    assert torch.equal(a, base_x)
    assert b.stride() == (1, 256) and torch.equal(b, base_w.t())


def test_any_generate_failure_is_returned_not_raised(graph):
    template = CuteDSLTemplate("bad_input_node", "{{def_kernel('a', 'b')}}\n    pass\n")
    choices = []
    err = template.maybe_append_choice(choices, input_nodes=["not an IR node"],
                                       layout=make_layout((4, 4)), BLOCK=4)
    assert choices == [] and "'bad_input_node'" in str(err) and "BLOCK=4" in str(err)
