"""A Llama of Llama-3-8B-shaped layers trained on two GPUs under torch.compile max-autotune
with our GEMM (marker ``gpu``; skipped with fewer than two): FSDP2 and 2-way tensor
parallelism (``benchmarks/distributed_llama.py``: one process per GPU, NCCL without
NVLink multicast), Inductor's distributed autotuning on and our choices taking part
(``config.distributed_autotune``). On each rank the loss and the gradients (gathered
whole) of the run with CUTEDSL and of the same run without it (ATen's GEMMs) stay within
twice eager bf16's error of the fp32 run, plus 1e-3; both ranks' output code has the
same GEMMs of ours; and no CuTe kernel is
compiled by both ranks: each compiles its share of the GEMMs and loads the rest."""

import json

import pytest
import torch
import torch.multiprocessing

from benchmarks.distributed_llama import Shape, run_rank
from cutedsl_inductor.inductor import distributed

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs"),
    pytest.mark.skipif(not distributed.supported(),
                       reason="this torch's distributed autotuning is not taken part in"),
]

LAYERS = 2  # of the benchmark's 8: the same GEMMs, a quarter of the compile


@pytest.mark.parametrize("parallel", ["fsdp", "tp"])
def test_llama_trains_on_two_gpus_with_our_gemms(parallel, tmp_path, monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setenv("CUTEDSL_INDUCTOR_COMPILE_WORKERS", "0")  # each rank's compiles seen
    torch.multiprocessing.spawn(run_rank, nprocs=2, args=(
        2, str(tmp_path), parallel, ["fp32", "bf16", "aten", "cutedsl"], Shape(layers=LAYERS),
        2))
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for report in ranks:
        print(parallel, {name: {k: v for k, v in row.items() if k != "compiled"}
                         for name, row in report.items()})
        for variant in ("aten", "cutedsl"):
            for error in ("loss_error", "grad_error"):
                assert report[variant][error] <= 2 * report["bf16"][error] + 1e-3, (
                    variant, error, report[variant][error], report["bf16"][error])
        assert report["aten"]["kernels"] == []
        assert report["cutedsl"]["kernels"], "no CuteDSL GEMM in the output code"
        assert report["cutedsl"]["compiled"], "this rank autotuned none of the GEMMs"
    first, second = (report["cutedsl"] for report in ranks)
    assert first["kernels"] == second["kernels"]
    assert not set(first["compiled"]) & set(second["compiled"])
