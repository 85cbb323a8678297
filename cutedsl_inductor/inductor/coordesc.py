"""A warm process's coordinate descent, where torch re-runs it for nothing (torch 2.11).

Under ``coordinate_descent_tuning`` (``mode="max-autotune"``) Inductor tunes each Triton
kernel at its first launch and saves the config it found in its autotune cache. A warm
process loads the kernels of a cached graph from the FX graph cache's Triton bundle and
asks that cache again (``CachingAutotuner.recheck_autotune_cache``). Torch 2.11 drops
the answer twice over: a kernel compiled with one config (under max-autotune: a
persistent reduction whose row fills the block, such as a softmax over 1024 columns)
ignores it, and a kernel compiled with several keeps the cached config but not its mark
``found_by_coordesc``, which is what the first launch reads to skip tuning. Either way
the warm process tunes again, each try a Triton compile and a timing. Torch 2.13 applies
the cached config and its mark whatever the number compiled;
``install_coordesc_recheck()`` gives an older version that behaviour
(``config.coordesc_recheck``; a no-op where torch has it, decided by reading the
method's source for the condition).

Invariant: the config applied is the one a previous process found and saved for this
kernel (same source file, same configs hash: Inductor's own lookup), so the warm process
runs what the cold one tuned, as it would on torch 2.13; a cache miss changes nothing.
Failure semantics: torch's own (a config that does not compile raises as in 2.13);
where the method is not the one expected (renamed, another signature), nothing is
replaced.
"""

from __future__ import annotations

import functools
import inspect
import logging
from typing import Any

from torch._dynamo.utils import dynamo_timed
from torch._inductor.runtime import triton_heuristics as th

from .. import config

log = logging.getLogger(__name__)

# the condition by which torch 2.11 skips single-config kernels
_SKIPS_SINGLE_CONFIG = "len(cached_configs) == 1 and len(configs) > 1"


def _recheck_autotune_cache(self: Any, reload_kernel_from_src: Any) -> None:
    """The cached best config of this statically launchable kernel, applied whatever the
    number of configs it was compiled with (marked as found by coordinate descent where
    it was, so that its first launch does not tune again)."""
    compiled = [result.config for result in self.compile_results]
    cached, _, self.autotune_cache_info = th.check_autotune_cache(
        compiled, self.filename, self.inductor_meta)
    if len(cached) != 1:
        return  # no single answer: the configs stay, autotuning picks at the first launch
    best = cached[0]
    wanted = th.triton_config_to_hashable(best)
    for result in self.compile_results:
        if th.triton_config_to_hashable(result.config) == wanted:
            result.config.found_by_coordesc = getattr(best, "found_by_coordesc", False)
            self.compile_results = [result]
            return
    # found by coordinate descent after the bundle was saved: compile it now
    with dynamo_timed("CachingAutotuner.slow_precompile_config"):
        if self.fn.fn is None:
            self.fn = reload_kernel_from_src().fn
        self.compile_results = [self._precompile_config(best)]


@functools.cache
def install_coordesc_recheck() -> bool:
    """Replace ``recheck_autotune_cache`` where this torch skips single-config kernels
    (and ``config.coordesc_recheck`` is on); whether it was replaced."""
    if not config.coordesc_recheck:
        return False
    try:
        method = th.CachingAutotuner.recheck_autotune_cache
        source = inspect.getsource(method)
    except (AttributeError, OSError, TypeError):
        return False
    if _SKIPS_SINGLE_CONFIG not in source or list(inspect.signature(method).parameters) != [
            "self", "reload_kernel_from_src"]:
        return False
    th.CachingAutotuner.recheck_autotune_cache = _recheck_autotune_cache
    log.debug("recheck_autotune_cache replaced: cached configs of single-config kernels apply")
    return True
