"""Real models from transformers through torch.compile max-autotune with our GEMM and ATen
as the GEMM backends (marker ``gpu``): a Llama of two Llama-3-8B-shaped layers, prefill- and decode-sized
inference, with and without CUDA graphs, and a training step, each with epilogue fusion
on and off. Outputs and gradients match an fp32 copy of the model within twice eager
bf16's error; a warm second process hits the FX graph cache, compiles no CuTe kernel and
autotunes nothing. Each case runs in a process of its own (``bench.model.run_child``);
all share one Inductor cache directory, so later cases reuse earlier autotuning, and the
kernel cache that CUTEDSL_INDUCTOR_CACHE_DIR names (kernels precompiled without a GPU,
``benchmarks/gpu_all.sh``), else one of their own."""

import os
from pathlib import Path

import pytest

from cutedsl_inductor.bench.model import Case, run_child

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    return tmp_path_factory.mktemp("model-caches")


@pytest.fixture(scope="module")
def kernels(caches):
    configured = os.environ.get("CUTEDSL_INDUCTOR_CACHE_DIR")
    return Path(configured) if configured else caches / "kernels"


@pytest.mark.parametrize("fusion", [True, False], ids=["fusion", "no-fusion"])
@pytest.mark.parametrize("workload", ["train", "prefill", "decode", "decode-graphs"])
def test_llama_under_max_autotune_with_cutedsl(workload, fusion, caches, kernels):
    # our GEMM against ATen alone: autotuning times no Triton template, and ATen takes the
    # GEMMs ours cannot (the rotary embedding's fp32 bmm; with CUTEDSL alone Inductor
    # raises NoValidChoicesError for them, as for any backend list without ATEN)
    case = Case("llama", workload, "cutedsl", fusion=fusion, gemm_backends="ATEN,CUTEDSL",
                steps=10, warmup=2)
    row = run_child(case, caches, kernels)
    print(row)
    assert row["ok"], row
    assert row["cute_kernels"] > 0, "no CuteDSL kernel in the output code"
    if fusion:
        warm = run_child(case, caches, kernels)
        print(warm)
        assert warm["ok"], warm
        assert warm["fx_hits"] > 0 and warm["fx_misses"] == 0, warm
        assert warm["cute_compiled"] == 0, warm
        assert warm["autotunings"] == 0 and warm["retimed"] == 0, warm
        assert not warm["cutlass_imported"], warm
