"""What pyproject, the Makefile and the import promise: tested dependency ranges, a
license, a warning under an untested torch, no phony target without a recipe; what the
sdist and the wheel hold (built by setuptools from the tracked files)."""

import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
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
    ("2.11.0", True), ("2.12.1+cu130", True), ("2.13.0+cpu", True), ("2.14.1+cu130", True),
    ("2.15.0+cu132", True), ("2.10.2", False), ("2.16.0.dev20260101", False), ("3.0.0", False),
    ("nightly", False)])
def test_a_torch_outside_the_tested_range_is_named(version, tested):
    message = cutedsl_inductor.untested_torch(version)
    assert (message is None) == tested
    if not tested:
        assert f"tested with torch >=2.11,<2.16 and this is torch {version}" in message


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


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The sdist and the wheel, built by setuptools from a copy of the tracked files."""
    folder = tmp_path_factory.mktemp("checkout")
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True).stdout.decode().split("\0")
    for name in filter(None, tracked):
        if (ROOT / name).is_file():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, folder / name)
    names = []
    for kind in ("sdist", "wheel"):  # a process each: setuptools keeps state between them
        code = f"from setuptools import build_meta; print(build_meta.build_{kind}('dist'))"
        run = subprocess.run([sys.executable, "-c", code], cwd=folder, capture_output=True,
                             text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
        names.append(run.stdout.split()[-1])
    sdist, wheel = names
    with tarfile.open(folder / "dist" / sdist) as archive:
        sdist_names = [name.split("/", 1)[1] for name in archive.getnames() if "/" in name]
    with zipfile.ZipFile(folder / "dist" / wheel) as archive:
        return sdist_names, archive.namelist(), archive.read(
            next(n for n in archive.namelist() if n.endswith("METADATA"))).decode()


def test_the_sdist_ships_no_tests_and_the_docs_the_readme_links(built):
    sdist, _, _ = built
    assert not [name for name in sdist if name.startswith(("tests/", "benchmarks/"))]
    assert {"README.md", "LICENSE", "pyproject.toml", "docs/configuration.md",
            "cutedsl_inductor/py.typed", "cutedsl_inductor_cli/__init__.py"} <= set(sdist)


def test_the_wheel_is_typed_and_says_where_it_runs(built):
    _, wheel, metadata = built
    assert {"cutedsl_inductor/py.typed", "cutedsl_inductor_cli/__init__.py"} <= set(wheel)
    assert not [name for name in wheel if name.startswith("tests/")]
    assert "Classifier: Typing :: Typed" in metadata
    assert "Classifier: Environment :: GPU :: NVIDIA CUDA" in metadata
    assert re.search(r"^Requires-Dist: transformers[^;]*; extra == \"bench\"$", metadata, re.M)
