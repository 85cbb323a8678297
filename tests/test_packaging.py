"""What pyproject, the Makefile and the import promise: tested dependency ranges, a
license, a warning under an untested torch, no phony target without a recipe."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

import cutedsl_inductor

ROOT = Path(__file__).resolve().parents[1]


def dependencies():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {re.match(r"[\w-]+", spec).group(): spec for spec in project["dependencies"]}


def test_dependencies_are_ranges_and_torch_matches_the_import_check():
    specs = dependencies()
    assert not [spec for spec in specs.values() if "==" in spec]
    (low_major, low_minor), (high_major, high_minor) = cutedsl_inductor.TESTED_TORCH
    assert specs["torch"] == f"torch>={low_major}.{low_minor},<{high_major}.{high_minor}"
    assert specs["nvidia-cutlass-dsl"] == "nvidia-cutlass-dsl[cu13]>=4.8,<4.9"


def test_the_license_is_the_one_pyproject_names():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "BSD-3-Clause" and project["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().startswith("BSD 3-Clause License")


@pytest.mark.parametrize("version, tested", [
    ("2.11.0", True), ("2.12.1+cu130", True), ("2.13.0+cpu", True), ("2.10.2", False),
    ("2.14.0.dev20260101", False), ("3.0.0", False), ("nightly", False)])
def test_a_torch_outside_the_tested_range_is_named(version, tested):
    message = cutedsl_inductor.untested_torch(version)
    assert (message is None) == tested
    if not tested:
        assert f"tested with torch >=2.11,<2.14 and this is torch {version}" in message


def test_importing_under_the_tested_torch_does_not_warn_about_it():
    run = subprocess.run([sys.executable, "-W", "always", "-c", "import cutedsl_inductor"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "cutedsl_inductor was tested with torch" not in run.stderr


def test_every_phony_make_target_has_a_recipe():
    makefile = (ROOT / "Makefile").read_text()
    (phony,) = re.findall(r"^\.PHONY:(.*)$", makefile, re.M)
    for target in phony.split():
        assert re.search(rf"^{re.escape(target)}:.*\n\t\S", makefile, re.M), target
