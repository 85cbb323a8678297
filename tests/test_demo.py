"""The demo without a GPU (``cutedsl_inductor demo``): real GPU-less compiles, its exit
status and what it says."""

import pytest
import torch

from cutedsl_inductor import config
from cutedsl_inductor.cli import main

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the demo without a GPU")


def test_the_demo_compiles_its_kernels_and_says_nothing_ran(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "9 compiled" in out and "0 failed" in out and "Nothing ran on a GPU" in out


def test_a_demo_whose_kernels_fail_to_compile_fails(capsys, monkeypatch):
    monkeypatch.setattr(config, "compile_options", "--no-such-option")
    assert main(["demo"]) == 1
    out, err = capsys.readouterr()
    assert "9 failed" in out and "load without compiling" not in out
    assert "The demo FAILED: 9 of its kernels did not compile" in err
