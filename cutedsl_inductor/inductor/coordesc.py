"""A warm process's coordinate descent, where torch and Triton re-run it for nothing.

Under ``coordinate_descent_tuning`` (``mode="max-autotune"``) Inductor tunes each Triton
kernel at its first launch and saves the config it found, marked ``found_by_coordesc``,
in its autotune cache (local, and Redis where its remote cache is on). A warm process
reads that cache for each kernel; the first launch skips tuning only where the kernel's
one launcher carries the mark. Three things lose it, each costing the warm process a
tuning run (each try a Triton compile and a timing) and, through the save at its end,
the next process too:

- ``CachingAutotuner.recheck_autotune_cache`` (a kernel loaded from the FX graph cache's
  Triton bundle), torch 2.11: a kernel compiled with one config ignores the cached answer
  (under max-autotune: a persistent reduction whose row fills the block, such as a
  softmax over 1024 columns), and one compiled with several keeps the cached config but
  not its mark. Replaced by torch 2.13's (the cached config and its mark applied
  whatever the number compiled), where the method carries 2.11's condition.
- ``CachingAutotuner._dynamic_scale_rblock``, torch 2.11: run on a cache hit too, it adds
  a reduction config with a halved block, so the kernel has two launchers, and the
  timing that picks one saves its pick unmarked over the cached answer. Torch 2.13 returns
  at once on a hit; so does the wrapper, where the method does not check the hit.
- ``triton.Config.__setstate__`` (Triton 3.x, any torch): a kernel compiled in a worker
  process comes back pickled, and Config's own ``__setstate__`` rebuilds seven fields,
  dropping the mark the worker's cache hit had set. The wrapper restores it from the
  pickled state, where a pickled marked Config comes back unmarked.

``install_coordesc_reuse()`` applies each that this torch and Triton need, decided by
reading the method's source (or, for Config, by pickling one), behind
``config.coordesc_recheck``. Invariant: the config a warm process runs is the one a
previous process found and saved for this kernel (same source file, same configs hash:
Inductor's own lookup), as torch 2.13 runs it; a cache miss changes nothing. Failure
semantics: torch's own (a config that does not compile raises as in 2.13); a method that
is not the one expected (renamed, another signature) is left as it is.
"""

from __future__ import annotations

import functools
import inspect
import logging
import pickle
from typing import Any

from torch._dynamo.utils import dynamo_timed
from torch._inductor.runtime import triton_heuristics as th

from .. import config

log = logging.getLogger(__name__)

# the condition by which torch 2.11 skips single-config kernels
_SKIPS_SINGLE_CONFIG = "len(cached_configs) == 1 and len(configs) > 1"
_MARK = "found_by_coordesc"


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
            setattr(result.config, _MARK, getattr(best, _MARK, False))
            self.compile_results = [result]
            return
    # found by coordinate descent after the bundle was saved: compile it now
    with dynamo_timed("CachingAutotuner.slow_precompile_config"):
        if self.fn.fn is None:
            self.fn = reload_kernel_from_src().fn
        self.compile_results = [self._precompile_config(best)]


def _cache_hit(autotuner: Any) -> bool:
    info = getattr(autotuner, "autotune_cache_info", None)
    return bool(info) and info.get("autotune_cache_state") == "hit"


def _skipping_on_a_hit(scale: Any) -> Any:
    """``_dynamic_scale_rblock`` that does nothing where the autotune cache answered."""
    @functools.wraps(scale)
    def dynamic_scale_rblock(self: Any) -> None:
        if not _cache_hit(self):
            scale(self)
    return dynamic_scale_rblock


def _keeping_the_mark(setstate: Any) -> Any:
    """``Config.__setstate__`` that keeps the pickled ``found_by_coordesc``."""
    @functools.wraps(setstate)
    def config_setstate(self: Any, state: Any) -> None:
        setstate(self, state)
        if isinstance(state, dict) and state.get(_MARK):
            setattr(self, _MARK, True)
    return config_setstate


def _source(method: Any) -> str | None:
    try:
        return inspect.getsource(method)
    except (OSError, TypeError):
        return None


def _method(name: str, params: list[str], needs_fix: Any) -> Any:
    """CachingAutotuner's method ``name``, where its parameters are ``params`` and
    ``needs_fix(its source)`` holds; else None (another torch: left as it is)."""
    method = getattr(th.CachingAutotuner, name, None)
    source = _source(method) if method is not None else None
    if source is None or not needs_fix(source) or list(
            inspect.signature(method).parameters) != params:
        return None
    return method


def _patch_recheck() -> bool:
    if _method("recheck_autotune_cache", ["self", "reload_kernel_from_src"],
               lambda source: _SKIPS_SINGLE_CONFIG in source) is None:
        return False
    th.CachingAutotuner.recheck_autotune_cache = _recheck_autotune_cache
    return True


def _patch_rblock_scaling() -> bool:
    method = _method("_dynamic_scale_rblock", ["self"],
                     lambda source: "autotune_cache_state" not in source)
    if method is None:
        return False
    th.CachingAutotuner._dynamic_scale_rblock = _skipping_on_a_hit(method)
    return True


def _patch_config_pickling(cls: Any) -> bool:
    """Make ``cls`` (Triton's Config) keep the mark through pickling, where it drops it."""
    setstate = getattr(cls, "__setstate__", None) if cls is not None else None
    if setstate is None or setstate is getattr(object, "__setstate__", None):
        return False  # default unpickling: the instance's whole __dict__ comes back
    try:
        probe = cls({})
        setattr(probe, _MARK, True)
        if getattr(pickle.loads(pickle.dumps(probe)), _MARK, False):
            return False  # this Config keeps it
    except Exception:  # noqa: BLE001 - a Config we cannot probe is left alone
        return False
    cls.__setstate__ = _keeping_the_mark(setstate)
    return True


@functools.cache
def install_coordesc_reuse() -> tuple[str, ...]:
    """Apply each fix this torch and Triton need (and ``config.coordesc_recheck`` is on);
    the names of those applied."""
    if not config.coordesc_recheck:
        return ()
    fixes = {"recheck_autotune_cache": _patch_recheck,
             "_dynamic_scale_rblock": _patch_rblock_scaling,
             "Config.__setstate__": lambda: _patch_config_pickling(getattr(th, "Config", None))}
    applied = tuple(name for name, patch in fixes.items() if patch())
    log.debug("coordinate-descent results reused in warm processes: %s replaced",
              ", ".join(applied) or "nothing")
    return applied
