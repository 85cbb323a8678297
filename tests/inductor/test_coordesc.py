"""``install_coordesc_recheck`` replaces torch's ``recheck_autotune_cache`` only where it
skips single-config kernels (torch 2.11; fixed in 2.13, whose own stays) (the warm-process
behaviour itself is a GPU test: ``tests/gpu/test_e2e.py``)."""

import inspect

import torch
from torch._inductor.runtime.triton_heuristics import CachingAutotuner

import cutedsl_inductor  # noqa: F401  (installs)
from cutedsl_inductor.inductor.coordesc import (
    _SKIPS_SINGLE_CONFIG,
    _recheck_autotune_cache,
    install_coordesc_recheck,
)


def test_replaced_exactly_where_torch_skips_single_config_kernels():
    replaced = CachingAutotuner.recheck_autotune_cache is _recheck_autotune_cache
    assert install_coordesc_recheck() is replaced
    if not replaced:  # torch's own: it must not carry the skip
        assert _SKIPS_SINGLE_CONFIG not in inspect.getsource(CachingAutotuner.recheck_autotune_cache)
    if tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 13):
        assert not replaced  # fixed upstream


def test_the_replacement_takes_torchs_arguments():
    assert list(inspect.signature(_recheck_autotune_cache).parameters) == [
        "self", "reload_kernel_from_src"]
