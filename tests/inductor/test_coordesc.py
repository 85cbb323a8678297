"""``install_coordesc_reuse`` replaces torch's ``recheck_autotune_cache`` and wraps its
``_dynamic_scale_rblock`` only where they lose a cached coordinate-descent config (torch
2.11; 2.13's own stay), and makes a Config that drops ``found_by_coordesc`` when
unpickled keep it (Triton 3.x's, probed by pickling; here a class that rebuilds its
fields as Triton's does). The warm-process behaviour itself is a GPU test
(``tests/gpu/test_e2e.py``)."""

import inspect
import pickle

from torch._inductor.runtime.triton_heuristics import CachingAutotuner

import cutedsl_inductor  # noqa: F401  (installs)
from cutedsl_inductor.inductor.coordesc import (
    _SKIPS_SINGLE_CONFIG,
    _patch_config_pickling,
    _recheck_autotune_cache,
    _skipping_on_a_hit,
    install_coordesc_reuse,
)
from tests.helpers import TORCH

TORCH_2_13 = TORCH >= (2, 13)


def test_recheck_replaced_exactly_where_torch_skips_single_config_kernels():
    replaced = CachingAutotuner.recheck_autotune_cache is _recheck_autotune_cache
    assert ("recheck_autotune_cache" in install_coordesc_reuse()) is replaced
    if not replaced:  # torch's own: it must not carry the skip
        source = inspect.getsource(CachingAutotuner.recheck_autotune_cache)
        assert _SKIPS_SINGLE_CONFIG not in source
    assert not (TORCH_2_13 and replaced)  # fixed upstream


def test_rblock_scaling_wrapped_exactly_where_torch_scales_on_a_cache_hit():
    wrapped = "_dynamic_scale_rblock" in install_coordesc_reuse()
    source = inspect.getsource(CachingAutotuner._dynamic_scale_rblock)
    assert wrapped == hasattr(CachingAutotuner._dynamic_scale_rblock, "__wrapped__")
    if not wrapped:
        assert "autotune_cache_state" in source  # torch's own returns on a hit
    assert not (TORCH_2_13 and wrapped)


def test_the_wrapped_rblock_scaling_runs_only_without_a_cache_hit():
    scaled = []

    class Tuner:
        def __init__(self, info):
            self.autotune_cache_info = info

    scale = _skipping_on_a_hit(lambda self: scaled.append(self))
    hit, miss, none = Tuner({"autotune_cache_state": "hit"}), Tuner(
        {"autotune_cache_state": "miss"}), Tuner(None)
    for tuner in (hit, miss, none):
        scale(tuner)
    assert scaled == [miss, none]


class RebuildingConfig:
    """Pickles as Triton 3.x's Config does: its state is ``__dict__``, its
    ``__setstate__`` rebuilds the fields it knows, and an attribute set later is lost."""

    def __init__(self, kwargs, num_warps=4):
        self.kwargs, self.num_warps = kwargs, num_warps

    def __setstate__(self, state):
        self.kwargs = state.get("kwargs", {})
        self.num_warps = state.get("num_warps", 4)


class KeepingConfig:
    def __init__(self, kwargs):
        self.kwargs = kwargs


def round_trip(config):
    config.found_by_coordesc = True
    return pickle.loads(pickle.dumps(config))


def test_a_config_that_drops_the_mark_keeps_it_once_patched():
    assert not hasattr(round_trip(RebuildingConfig({"XBLOCK": 64})), "found_by_coordesc")
    assert _patch_config_pickling(RebuildingConfig)
    back = round_trip(RebuildingConfig({"XBLOCK": 64}, num_warps=8))
    assert back.found_by_coordesc and (back.kwargs, back.num_warps) == ({"XBLOCK": 64}, 8)
    unmarked = pickle.loads(pickle.dumps(RebuildingConfig({})))
    assert not getattr(unmarked, "found_by_coordesc", False)
    assert not _patch_config_pickling(RebuildingConfig)  # it keeps the mark now
    assert not _patch_config_pickling(KeepingConfig)  # default pickling keeps it
    assert not _patch_config_pickling(None)
