"""The README's quick start: its template renders and compiles (GPU-less for sm_90a), and
its whole code runs as written on a GPU; without one (CPU tensors) it ends in an error
that says why, naming the template. The knob table (docs/configuration.md) is config.py's,
and the docs link nowhere but into the repository and to upstream's pages."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tvm_ffi

from cutedsl_inductor import CuteDSLTemplate, config
from tests.helpers import make_input, make_layout

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
UPSTREAM_PAGES = ("https://docs.nvidia.com/cutlass/", "https://pytorch.org/",
                  "https://github.com/pytorch/pytorch", "https://github.com/NVIDIA/cutlass")


def quick_start_code():
    (code,) = [block for block in re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
               if "SRC = r'''" in block]
    return code


def run_quick_start(code, tmp_path):
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def test_the_configuration_table_is_config_py_s():
    """docs/configuration.md's knob table is ``config.docs_table()`` (paste its output to update)."""
    table = config.docs_table()
    assert table in (ROOT / "docs" / "configuration.md").read_text(), table


def test_links_stay_in_the_repository_or_go_to_upstream_pages():
    for text in [README.read_text()] + [p.read_text() for p in (ROOT / "docs").glob("*.md")]:
        for target in re.findall(r"\]\(([^)]+)\)", text):
            if target.startswith("http"):
                assert target.startswith(UPSTREAM_PAGES), target
            else:
                assert any((base / target).exists() for base in (ROOT, ROOT / "docs")), target


def test_quick_start_template_compiles(graph):
    source = re.search(r"SRC = r'''(.*?)'''", quick_start_code(), re.S).group(1)
    template = CuteDSLTemplate("readme_add", source)
    inputs = [make_input(graph, "arg0_1", (100, 30)), make_input(graph, "arg1_1", (100, 30))]
    for threads in (128, 256, 512):
        choice = template.generate(input_nodes=inputs, layout=make_layout((100, 30)),
                                   THREADS_PER_BLOCK=threads)
        assert isinstance(choice.load().kernel_fn, tvm_ffi.Function)


def test_quick_start_on_cpu_tensors_says_why_it_cannot_run(tmp_path):
    code = quick_start_code()
    assert 'device="cuda"' in code
    run = run_quick_start(code.replace('device="cuda"', 'device="cpu"'), tmp_path)
    assert run.returncode != 0
    for threads in (128, 256, 512):  # each choice dropped, with the template and reason
        assert re.search(rf"'my_add'.*THREADS_PER_BLOCK={threads}.*on cpu.*CUDA GPUs only",
                         run.stderr)
    assert "no choice to select from for 'my_add'" in run.stderr


@pytest.mark.gpu
def test_quick_start_runs_as_written(tmp_path):
    run = run_quick_start(quick_start_code(), tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]


def test_the_gpu_less_route_checks_the_quick_start_template(tmp_path):
    """The command the quick start gives, on its code down to ``template = ...``."""
    code = quick_start_code()
    head = code[:code.index("\n", code.index("template = CuteDSLTemplate("))]
    (tmp_path / "my_templates.py").write_text(head)
    (command,) = re.findall(r"\n    (cutedsl-inductor check [^\n]*\\\n[^\n]*)\n",
                            README.read_text())
    args = command.replace("\\\n", " ").split()[1:]
    run = subprocess.run([sys.executable, "-m", "cutedsl_inductor", *args], cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert run.stdout.strip().endswith("3 of 3 choice(s) compiled for sm_90a")
