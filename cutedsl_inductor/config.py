"""Every knob of cutedsl_inductor, each with an environment-variable mirror.

A knob is read from its env var once, at import, and may be changed afterwards by
assignment (``cutedsl_inductor.config.arch = "sm_90a"``) or temporarily with
``config.patch(name=value)``. Nothing else in the package reads the environment.

Knob                     env var                                     default
cache_dir                CUTEDSL_INDUCTOR_CACHE_DIR                  <inductor cache dir>/cutedsl
disk_cache               CUTEDSL_INDUCTOR_DISK_CACHE                 True
arch                     CUTEDSL_INDUCTOR_ARCH (else CUTE_DSL_ARCH)  detected GPU, else "sm_90a"
entry_suffix             CUTEDSL_INDUCTOR_ENTRY_SUFFIX               "main"
compile_options          CUTEDSL_INDUCTOR_COMPILE_OPTIONS            ""
gemm_max_configs         CUTEDSL_INDUCTOR_GEMM_MAX_CONFIGS           8
gemm_exhaustive          CUTEDSL_INDUCTOR_GEMM_EXHAUSTIVE            False
epilogue_fusion          CUTEDSL_INDUCTOR_EPILOGUE_FUSION            False (opt-in; also SwiGLU)
fused_choice_candidates  CUTEDSL_INDUCTOR_FUSED_CHOICE_CANDIDATES    3
compile_workers          CUTEDSL_INDUCTOR_COMPILE_WORKERS            CPUs / 2, <= 8; 0 below 4 CPUs
autotune_settle_ms       CUTEDSL_INDUCTOR_AUTOTUNE_SETTLE_MS         300
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any


def _env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    return raw.strip().lower() not in ("0", "false", "no", "off")


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return int(raw) if raw else default


# Directory of the compiled-kernel cache; None means "<inductor cache dir>/cutedsl".
cache_dir: str | None = os.environ.get("CUTEDSL_INDUCTOR_CACHE_DIR") or None
# Whether compiled kernels are exported to and reloaded from ``cache_dir``.
disk_cache: bool = _env_bool("CUTEDSL_INDUCTOR_DISK_CACHE", True)
# Target GPU architecture (e.g. "sm_90a"); None means: the current GPU, else sm_90a.
arch: str | None = (
    os.environ.get("CUTEDSL_INDUCTOR_ARCH") or os.environ.get("CUTE_DSL_ARCH") or None
)
# The entry point that ``def_kernel`` defines is named ``<kernel_name>_<entry_suffix>``.
entry_suffix: str = os.environ.get("CUTEDSL_INDUCTOR_ENTRY_SUFFIX", "main")
# Extra options handed to ``cute.compile`` (part of every cache key).
compile_options: str = os.environ.get("CUTEDSL_INDUCTOR_COMPILE_OPTIONS", "")
# How many GEMM configs the heuristic offers per shape, and whether to offer all.
gemm_max_configs: int = _env_int("CUTEDSL_INDUCTOR_GEMM_MAX_CONFIGS", 8)
gemm_exhaustive: bool = _env_bool("CUTEDSL_INDUCTOR_GEMM_EXHAUSTIVE", False)
# Fuse pointwise consumers into templates that define an epilogue (``def_epilogue``), and
# (with CUTEDSL a max-autotune GEMM backend) SwiGLU's two GEMMs into one
# (``inductor/swiglu.py``).
epilogue_fusion: bool = _env_bool("CUTEDSL_INDUCTOR_EPILOGUE_FUSION", False)
# Under max-autotune, how many of our fastest choices for a GEMM with a pointwise consumer
# are timed again with that epilogue fused, and for SwiGLU's fused GEMM again, in
# interleaved rounds; the fastest is taken (< 2: no retiming).
fused_choice_candidates: int = _env_int("CUTEDSL_INDUCTOR_FUSED_CHOICE_CANDIDATES", 3)
# Processes that compile the choices Inductor precompiles (0: compile in this process,
# one kernel at a time: CuTe's compiler is not re-entrant).
_HALF_THE_CPUS = min(8, (os.cpu_count() or 1) // 2)
compile_workers: int = _env_int("CUTEDSL_INDUCTOR_COMPILE_WORKERS",
                                _HALF_THE_CPUS if _HALF_THE_CPUS >= 2 else 0)

# Before the first timing of an autotuning that has our choices, run that choice this
# many milliseconds untimed, so that no choice is timed at the clock an idle GPU boosts
# to (``autotune/select.py``); 0: off.
autotune_settle_ms: int = _env_int("CUTEDSL_INDUCTOR_AUTOTUNE_SETTLE_MS", 300)


@contextlib.contextmanager
def patch(**changes: Any) -> Iterator[None]:
    """Temporarily set knobs: ``with config.patch(disk_cache=False): ...``."""
    module = globals()
    unknown = [name for name in changes if name not in _KNOBS]
    if unknown:
        raise AttributeError(f"unknown cutedsl_inductor config knob(s): {unknown}")
    saved = {name: module[name] for name in changes}
    module.update(changes)
    try:
        yield
    finally:
        module.update(saved)


_KNOBS = (
    "cache_dir",
    "disk_cache",
    "arch",
    "entry_suffix",
    "compile_options",
    "gemm_max_configs",
    "gemm_exhaustive",
    "epilogue_fusion",
    "fused_choice_candidates",
    "compile_workers",
    "autotune_settle_ms",
)


def snapshot() -> dict[str, Any]:
    """The knobs that change generated code or binaries (goes into cache keys)."""
    return {"entry_suffix": entry_suffix, "compile_options": compile_options,
            "arch": arch, "gemm_max_configs": gemm_max_configs,
            "gemm_exhaustive": gemm_exhaustive, "epilogue_fusion": epilogue_fusion,
            "fused_choice_candidates": fused_choice_candidates}
