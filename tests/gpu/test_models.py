"""Real models from transformers through torch.compile max-autotune with our kernels
(marker ``gpu``): a Llama of two Llama-3-8B-shaped layers, prefill- and decode-sized
inference, with and without CUDA graphs, and a training step, each with epilogue fusion
on and off. Outputs and gradients match an fp32 copy of the model within twice eager
bf16's error; a warm second process hits the FX graph cache, compiles no CuTe kernel and
autotunes nothing. Each case runs in a process of its own (``bench.model.run_child``);
all share one cache directory, so later cases reuse earlier autotuning and kernels."""

import pytest

from cutedsl_inductor.bench.model import Case, run_child

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    return tmp_path_factory.mktemp("model-caches")


@pytest.mark.parametrize("fusion", [True, False], ids=["fusion", "no-fusion"])
@pytest.mark.parametrize("workload", ["prefill", "decode", "decode-graphs", "train"])
def test_llama_under_max_autotune_with_cutedsl(workload, fusion, caches):
    case = Case("llama", workload, "cutedsl", fusion=fusion, steps=2, warmup=1)
    row = run_child(case, caches)
    assert row["ok"], row
    assert row["cute_kernels"] > 0, "no CuteDSL kernel in the output code"
    if fusion:
        warm = run_child(case, caches)
        assert warm["ok"], warm
        assert warm["fx_hits"] > 0 and warm["fx_misses"] == 0, warm
        assert warm["cute_compiled"] == 0 and warm["autotunings"] == 0, warm
