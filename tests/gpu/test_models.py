"""Real models from transformers through torch.compile max-autotune with our GEMM and ATen
as the GEMM backends (marker ``gpu``): a Llama of two Llama-3-8B-shaped layers, prefill,
real decode (a static KV cache) with and without CUDA graphs, small-M steps and a training
step, each with epilogue fusion on and off. Outputs and gradients match an fp32 copy of
the model within twice eager bf16's error; a warm second process hits the FX graph cache,
compiles no CuTe kernel and autotunes nothing. Each case is a first call in a process of
its own (``bench.model.run_child``); all share one Inductor cache directory, so later cases
reuse earlier autotuning, and the kernel cache that CUTEDSL_INDUCTOR_CACHE_DIR names
(kernels precompiled without a GPU, ``benchmarks/gpu_all.sh``), else one of their own."""

import os
from pathlib import Path

import pytest

from cutedsl_inductor.bench.model import run_child
from cutedsl_inductor.bench.model_measure import FirstCall
from cutedsl_inductor.bench.model_variants import Variant
from cutedsl_inductor.bench.model_workloads import Shape

pytestmark = pytest.mark.gpu

SHAPES = {"train": Shape(2, 2048), "prefill": Shape(4, 2048), "decode": Shape(8, 1024),
          "decode-graphs": Shape(8, 1024, graphs=True), "small-m": Shape(64, 1)}


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    return tmp_path_factory.mktemp("model-caches")


@pytest.fixture(scope="module")
def kernels(caches):
    configured = os.environ.get("CUTEDSL_INDUCTOR_CACHE_DIR")
    return Path(configured) if configured else caches / "kernels"


def first_call(case, caches, kernels):
    rows, failed = run_child("--first-call", case.to_json(), caches / "logs", caches, kernels)
    assert not failed, failed
    (row,) = rows
    print(row)
    return row


@pytest.mark.parametrize("fusion", [True, False], ids=["fusion", "no-fusion"])
@pytest.mark.parametrize("name", list(SHAPES))
def test_llama_under_max_autotune_with_cutedsl(name, fusion, caches, kernels):
    # our GEMM against ATen alone: autotuning times no Triton template, and ATen takes the
    # GEMMs ours cannot (the rotary embedding's fp32 bmm; with CUTEDSL alone Inductor
    # raises NoValidChoicesError for them, as for any backend list without ATEN)
    case = FirstCall("llama", name.removesuffix("-graphs"), SHAPES[name],
                     Variant("cutedsl-no-triton", fusion=fusion), layers=2, new_tokens=8)
    row = first_call(case, caches, kernels)
    assert row["first_call_ok"], row
    assert row["first_call_cute_kernels"] > 0, "no CuteDSL kernel in the output code"
    if fusion:
        warm = first_call(case, caches, kernels)
        assert warm["first_call_ok"], warm
        assert warm["fx_hits"] > 0 and warm["fx_misses"] == 0, warm
        assert warm["cute_compiled"] == 0, warm
        assert warm["autotunings"] == 0 and warm["retimed"] == 0, warm
        assert not warm["cutlass_imported"], warm
