"""The virtual sm_90: Inductor lowers for it inside the block (our GEMM offered and
built), and nothing is left patched after it."""

import torch

from cutedsl_inductor import config
from cutedsl_inductor.bench.lowering import (
    kernel_definitions,
    load_kernels,
    lowered,
    virtual_sm90,
)


def test_the_virtual_sm90_lowers_our_gemm_inside_the_block_only():
    queries = (torch.cuda.get_device_properties, torch.cuda.get_device_capability)
    with virtual_sm90(), config.patch(gemm_max_configs=1), torch._inductor.config.patch(
            max_autotune=True, max_autotune_gemm_backends="CUTEDSL"):
        assert torch.cuda.get_device_capability() == (9, 0)
        assert torch.cuda.get_device_properties(0).multi_processor_count == 132
        with lowered(lambda x, w: x @ w.t(), (256, 128), (512, 128)) as graph:
            code = graph.codegen()[0].value
        (definition,) = kernel_definitions(code)
        kernels = load_kernels([definition])
    assert (torch.cuda.get_device_properties, torch.cuda.get_device_capability) == queries
    assert "cutedsl_sm90_gemm" in definition.targets[0].id
    assert kernels[definition.targets[0].id].kernel_fn is not None
