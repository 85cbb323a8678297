"""The import layers of pyproject.toml's import-linter contract: every import runs downhill
through the pipeline (compile -> runtime -> autotune -> template -> kernels -> inductor ->
precompile -> bench, demo -> cli), and a module that imports uphill breaks the contract."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT = "from importlinter.cli import lint_imports; raise SystemExit(lint_imports(no_cache=True))"


def lint(project):
    return subprocess.run([sys.executable, "-c", LINT], cwd=project, capture_output=True,
                          text=True, timeout=300, env={"PYTHONPATH": str(project)})


def test_every_import_runs_downhill():
    run = lint(ROOT)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "1 kept, 0 broken" in run.stdout


def test_an_import_from_a_higher_layer_breaks_the_contract(tmp_path):
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    shutil.copytree(ROOT / "cutedsl_inductor", tmp_path / "cutedsl_inductor",
                    ignore=shutil.ignore_patterns("__pycache__"))
    specs = tmp_path / "cutedsl_inductor" / "compile" / "specs.py"
    specs.write_text(specs.read_text() + "\n\ndef _uphill():\n"
                     "    from ..inductor import scheduling  # noqa: F401\n")
    run = lint(tmp_path)
    assert run.returncode != 0
    assert "cutedsl_inductor.compile.specs -> cutedsl_inductor.inductor.scheduling" in run.stdout
