"""The README's quick-start template renders and compiles (GPU-less for sm_90a)."""

import re
import tvm_ffi
from pathlib import Path

from cutedsl_inductor import CuteDSLTemplate
from tests.helpers import make_input, make_layout

README = Path(__file__).resolve().parents[1] / "README.md"


def test_quick_start_template_compiles(graph):
    source = re.search(r"SRC = r'''(.*?)'''", README.read_text(), re.S).group(1)
    template = CuteDSLTemplate("readme_add", source)
    inputs = [make_input(graph, "arg0_1", (100, 30)), make_input(graph, "arg1_1", (100, 30))]
    for threads in (128, 256, 512):
        choice = template.generate(input_nodes=inputs, layout=make_layout((100, 30)),
                                   THREADS_PER_BLOCK=threads)
        assert isinstance(choice.load().kernel_fn, tvm_ffi.Function)
