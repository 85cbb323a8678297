import jinja2
import pytest
from torch._inductor import ir

from cutedsl_inductor import config
from cutedsl_inductor.template.kernel import CuteDSLTemplateKernel, name_kernel
from tests.helpers import make_input, make_layout

HOOKS_SOURCE = """
# name={{kernel_name}} inputs={{input_nodes|length}} out={{output_node.get_name()}}
{{gen_defines()}}
{{def_kernel("x", "y")}}
    return {{get_output()}}, {{size("x", 0)}}, {{stride("x", 0)}}, {{size("y", 1)}}
"""


def render(graph, source, params=None, arg_shape=(32, 64)):
    a = make_input(graph, "arg0_1", arg_shape)
    b = make_input(graph, "arg1_1", arg_shape)
    out = ir.Buffer(name="buf0", layout=make_layout(arg_shape))
    kernel = CuteDSLTemplateKernel("k0", [a, b], out, params or {"BLOCK": 128})
    return kernel, kernel.render(jinja2.Template(source))


def test_every_hook_renders(graph):
    kernel, text = render(graph, HOOKS_SOURCE)
    assert "# name=k0 inputs=2 out=buf0" in text
    assert "BLOCK: cutlass.Constexpr = 128" in text
    assert "def k0_main(arg_x, arg_y, out_ptr0, stream):\n    x = arg_x\n    y = arg_y\n" in text
    assert "return out_ptr0, 32, 64, 64" in text
    assert text.startswith("import math")
    assert "import cutlass.cute as cute" in text
    assert "from cutlass.cute.runtime import from_dlpack" in text
    compile(text, "rendered", "exec")


def test_entry_suffix_is_configurable(graph):
    with config.patch(entry_suffix="entry"):
        _, text = render(graph, HOOKS_SOURCE)
    assert "def k0_entry(arg_x, arg_y, out_ptr0, stream):" in text


def test_params_are_visible_to_jinja(graph):
    _, text = render(graph, "{{def_kernel('x', 'y')}}\n    return {{BLOCK * 2}}\n")
    assert "return 256" in text


def test_def_kernel_twice_is_an_error(graph):
    with pytest.raises(ValueError, match="once"):
        render(graph, "{{def_kernel('x', 'y')}}\n{{def_kernel('x', 'y')}}\n")


def test_get_output_before_def_kernel_is_an_error(graph):
    with pytest.raises(ValueError, match="after def_kernel"):
        render(graph, "{{get_output()}}\n{{def_kernel('x', 'y')}}\n")


def test_call_args_follow_the_signature(graph):
    kernel, _ = render(graph, HOOKS_SOURCE)
    assert [n.get_name() for n in kernel.arg_nodes()] == ["arg0_1", "arg1_1", "buf0"]


def test_kernel_name_covers_the_rendered_text_and_the_specs():
    from cutedsl_inductor.compile.specs import Sym, TensorSpec

    k_major = [TensorSpec("bfloat16", (Sym("m"), Sym("k")), (Sym("ld", 8), 1), 16)]
    m_major = [TensorSpec("bfloat16", (Sym("m"), Sym("k")), (1, Sym("ld", 8)), 16)]
    text = "def __CUTEDSL_KERNEL_NAME___main(): pass"
    first = name_kernel("add", text, k_major)
    assert first == name_kernel("add", text, k_major)
    assert first[0].startswith("cutedsl_add_")
    assert first[1] == f"def {first[0]}_main(): pass"
    assert name_kernel("add", "def __CUTEDSL_KERNEL_NAME___main(): return 1",
                       k_major)[0] != first[0]
    # the same text compiled for another operand layout is another binary, another name
    assert name_kernel("add", text, m_major)[0] != first[0]


PARAMS = [{"P0": 1}, {"P0": 1, "P1": 2.5}, {"P0": 1, "P1": 2.5, "P2": True},
          {"P0": 1, "P1": 2.5, "P2": True, "P3": "s"},
          {"P0": 1, "P1": 2.5, "P2": True, "P3": "s", "P4": -3},
          {"P0": 1, "P1": 2.5, "P2": True, "P3": "s", "P4": -3, "P5": float("inf")}]


@pytest.mark.parametrize("params", PARAMS, ids=len)
@pytest.mark.parametrize("where", ["module", "function", "nested"])
def test_gen_defines_is_valid_python_at_any_indentation(graph, params, where):
    """Upstream's own test template puts ``gen_defines`` inside a function body."""
    source = {
        "module": "{{gen_defines()}}\n{{def_kernel('x', 'y')}}\n    return P0\n",
        "function": "{{def_kernel('x', 'y')}}\n    {{gen_defines()}}\n    return P0\n",
        "nested": ("{{def_kernel('x', 'y')}}\n    if True:\n        {{gen_defines()}}\n"
                   "        return P0\n"),
    }[where]
    _, text = render(graph, source, params)
    namespace = {}
    exec(compile(text, "rendered", "exec"), namespace)
    for name, value in params.items():
        assert f"{name}: cutlass.Constexpr = " in text
    assert namespace["k0_main"](None, None, None, None) == 1


def test_a_workspace_comes_after_the_output_and_has_its_spec(graph):
    from cutedsl_inductor.compile.specs import TensorSpec, Workspace, specs_for_nodes

    a = make_input(graph, "arg0_1", (32, 64))
    out = ir.Buffer(name="buf0", layout=make_layout((32, 64)))
    workspace = Workspace(32 * 64, "float32")
    kernel = CuteDSLTemplateKernel("k0", [a], out, {}, workspace=workspace)
    text = kernel.render(jinja2.Template(
        "{{def_kernel('x')}}\n    return {{get_workspace()}}, {{get_output()}}\n"))
    assert "def k0_main(arg_x, out_ptr0, workspace, stream):" in text
    assert "return workspace, out_ptr0" in text
    assert kernel.arg_nodes()[-1] is workspace
    assert kernel.call_references("workspace_0") == ["arg0_1", "buf0", "workspace_0"]
    assert specs_for_nodes(kernel.arg_nodes(), symbolic=False)[-1] == TensorSpec(
        "float32", (2048,), (1,), 16)


def test_get_workspace_without_one_is_an_error(graph):
    with pytest.raises(ValueError, match="no workspace"):
        render(graph, "{{def_kernel('x', 'y')}}\n    return {{get_workspace()}}\n")
