"""The picklable benchmark request: what a tuning subprocess gets of a CuteDSL choice
(real GEMM choice, real GPU-less compile, a real second process)."""

import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch._inductor import ir

from cutedsl_inductor import counters
from cutedsl_inductor.kernels.gemm.config import GemmConfig
from cutedsl_inductor.kernels.gemm.template import gemm_choices
from tests.helpers import make_input

LOAD_IN_A_NEW_PROCESS = """
import pickle, sys
from cutedsl_inductor import counters
with open(sys.argv[1], "rb") as f:
    request = pickle.load(f)
request.load()
print(counters.kernels.compiled, counters.kernels.disk_hits)
"""


def test_a_new_process_rebuilds_the_choice_from_its_request(graph, tmp_path):
    x = make_input(graph, "x", (200, 512), torch.bfloat16)
    w_t = make_input(graph, "w", (512, 384), torch.bfloat16, stride=(1, 512))  # w.t()
    layout = ir.FixedLayout(torch.device("cuda", 0), torch.bfloat16, [200, 384])
    choices = []
    gemm_choices(choices, "mm", [x, w_t], layout, configs=[
        GemmConfig(tile_m=64, tile_n=64, tile_k=64, cluster_m=1, cluster_n=1,
                   cooperative=False, raster="n")])
    (choice,) = choices
    choice.load()  # the parent's precompile: compiled into its disk cache
    request = choice.bmreq
    # one tensor per entry argument, as the kernel reads it (the transposed view)
    assert [(m.sizes, m.strides) for m in request.input_tensor_meta] == [
        ((200, 512), (512, 1)), ((512, 384), (1, 512))]
    assert request.output_tensor_meta.sizes == (200, 384)
    path = tmp_path / "request.pkl"
    path.write_bytes(pickle.dumps(request))
    run = subprocess.run([sys.executable, "-c", LOAD_IN_A_NEW_PROCESS, str(path)],
                         capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).parents[2])
    assert run.returncode == 0, run.stderr
    # the knobs travelled with it: the child found the parent's binary, compiled nothing
    assert run.stdout.split() == ["0", "1"]
    assert counters.kernels.compiled == 1


def test_a_choice_failing_in_inductors_tuning_process_says_why_there(graph, capfd):
    """Inductor's own tuning subprocess runs the request; it fails there (this machine
    has no GPU to make the tensors on), and the reason is logged in that process."""
    from torch._inductor.autotune_process import TuningProcess

    x = make_input(graph, "x", (128, 256), torch.bfloat16)
    w = make_input(graph, "w", (256, 128), torch.bfloat16)
    layout = ir.FixedLayout(torch.device("cuda", 0), torch.bfloat16, [128, 128])
    choices = []
    gemm_choices(choices, "mm", [x, w], layout, configs=[GemmConfig(64, 64, 64, raster="n", cooperative=False)])
    request = choices[0].bmreq
    process = TuningProcess(None)
    try:
        process.put(request.benchmark)
        with pytest.raises(Exception):
            process.get(300)
    finally:
        process.shutdown()
    logged = capfd.readouterr().err
    assert f"CuteDSL choice {request.kernel_name} (template 'sm90_gemm', parameters " \
        "[TILE_M=64, TILE_N=64, TILE_K=64" in logged
    assert "failed in the tuning subprocess" in logged
