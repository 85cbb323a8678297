"""Every knob of cutedsl_inductor, each with an environment-variable mirror.

A knob is read from its env var once, at import, and may be changed afterwards by
assignment (``cutedsl_inductor.config.arch = "sm_90a"``) or temporarily with
``config.patch(name=value)``. Nothing else in the package reads the environment.

Knob                     env var                                     default (accepted)
cache_dir                CUTEDSL_INDUCTOR_CACHE_DIR                  <inductor cache dir>/cutedsl
disk_cache               CUTEDSL_INDUCTOR_DISK_CACHE                 True (a boolean)
arch                     CUTEDSL_INDUCTOR_ARCH (else CUTE_DSL_ARCH)  detected GPU, else "sm_90a"
entry_suffix             CUTEDSL_INDUCTOR_ENTRY_SUFFIX               "main" (letters, digits, _)
compile_options          CUTEDSL_INDUCTOR_COMPILE_OPTIONS            "" (see RESERVED_OPTIONS)
gemm_max_configs         CUTEDSL_INDUCTOR_GEMM_MAX_CONFIGS           8 (1 to 1024)
gemm_exhaustive          CUTEDSL_INDUCTOR_GEMM_EXHAUSTIVE            False (a boolean)
epilogue_fusion          CUTEDSL_INDUCTOR_EPILOGUE_FUSION            False (opt-in; also SwiGLU)
fused_choice_candidates  CUTEDSL_INDUCTOR_FUSED_CHOICE_CANDIDATES    3 (0 to 64)
compile_workers          CUTEDSL_INDUCTOR_COMPILE_WORKERS            CPUs / 2, <= 8; 0 below 4
                                                                     CPUs (0 to the CPUs)
autotune_settle_ms       CUTEDSL_INDUCTOR_AUTOTUNE_SETTLE_MS         300 (0 to 60000)
remote_cache             CUTEDSL_INDUCTOR_REMOTE_CACHE               False (a boolean)
remote_cache_timeout_ms  CUTEDSL_INDUCTOR_REMOTE_CACHE_TIMEOUT_MS    1000 (1 to 60000)
remote_cache_secret_file CUTEDSL_INDUCTOR_REMOTE_CACHE_SECRET_FILE   None (a path)
redis_url                TORCHINDUCTOR_REDIS_URL (Inductor's)        None (redis://, rediss://,
                                                                     unix://)
redis_host               TORCHINDUCTOR_REDIS_HOST (Inductor's)       "localhost"
redis_port               TORCHINDUCTOR_REDIS_PORT (Inductor's)       6379 (1 to 65535)

Environment values are parsed strictly: a boolean is one of 1/0/true/false/yes/no/on/off
(any case), a count an integer in the knob's range, the arch ``sm_<digits>`` with an
optional ``a`` or ``f``, a Redis URL one of the three schemes; empty means the default.
The Redis address is Inductor's own (its remote caches read the same variables), so one
setting serves both. Anything else raises ``ConfigError``,
naming the variable and what it accepts, when the package is imported.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from typing import Any

from .exc import ConfigError

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
# cute.compile options that cutedsl_inductor sets itself (and labels entries with):
# refused in compile_options, abbreviated or not (CuTe's parser takes abbreviations)
RESERVED_OPTIONS = ("gpu-arch", "enable-tvm-ffi", "host-target")


def _raw(name: str) -> str | None:
    raw = os.environ.get(name, "").strip()
    return raw or None


def _env_bool(name: str, default: bool) -> bool:
    raw = _raw(name)
    if raw is None:
        return default
    if raw.lower() in _TRUE + _FALSE:
        return raw.lower() in _TRUE
    raise ConfigError(variable=name, value=raw,
                      accepted=f"a boolean: {'/'.join(_TRUE + _FALSE)} (any case)")


def _env_int(name: str, default: int, low: int, high: int) -> int:
    raw = _raw(name)
    if raw is None:
        return default
    if re.fullmatch(r"-?[0-9]+", raw) and low <= int(raw) <= high:
        return int(raw)
    raise ConfigError(variable=name, value=raw, accepted=f"an integer from {low} to {high}")


def _env_text(name: str, default: str | None, check: Any) -> str | None:
    raw = _raw(name)
    return default if raw is None else check(raw, name)


def check_arch(value: str, variable: str) -> str:
    """``sm_90a``-style arch names (CuTe DSL's own list is checked where it compiles)."""
    if re.fullmatch(r"sm_[0-9]+[af]?", value):
        return value
    raise ConfigError(variable=variable, value=value,
                      accepted="a GPU arch such as sm_90a or sm_100a")


def check_entry_suffix(value: str, variable: str) -> str:
    if re.fullmatch(r"[A-Za-z0-9_]+", value):
        return value
    raise ConfigError(variable=variable, value=value, accepted="letters, digits and _")


def check_compile_options(value: str, variable: str) -> str:
    """Options for ``cute.compile``, none of which sets what ``RESERVED_OPTIONS`` names."""
    for token in value.split():
        name = token[2:].split("=")[0] if token.startswith("--") else ""
        if name and any(option.startswith(name) for option in RESERVED_OPTIONS):
            raise ConfigError(
                variable=variable, value=value,
                accepted="cute.compile options other than "
                + ", ".join(f"--{option}" for option in RESERVED_OPTIONS)
                + " (cutedsl_inductor sets those; the arch is CUTEDSL_INDUCTOR_ARCH)")
    return value


def check_redis_url(value: str, variable: str) -> str:
    if re.fullmatch(r"(rediss?|unix)://\S+", value):
        return value
    raise ConfigError(variable=variable, value=value,
                      accepted="a Redis URL: redis://HOST:PORT, rediss://... or unix://PATH")


def _arch_from_env() -> str | None:
    for name in ("CUTEDSL_INDUCTOR_ARCH", "CUTE_DSL_ARCH"):
        raw = _raw(name)
        if raw is not None:
            return check_arch(raw, name)
    return None


# Directory of the compiled-kernel cache; None means "<inductor cache dir>/cutedsl".
cache_dir: str | None = os.environ.get("CUTEDSL_INDUCTOR_CACHE_DIR") or None
# Whether compiled kernels are exported to and reloaded from ``cache_dir``.
disk_cache: bool = _env_bool("CUTEDSL_INDUCTOR_DISK_CACHE", True)
# Target GPU architecture (e.g. "sm_90a"); None means: the current GPU, else sm_90a.
arch: str | None = _arch_from_env()
# The entry point that ``def_kernel`` defines is named ``<kernel_name>_<entry_suffix>``.
entry_suffix: str = _env_text("CUTEDSL_INDUCTOR_ENTRY_SUFFIX", "main", check_entry_suffix)
# Extra options handed to ``cute.compile`` (part of every cache key).
compile_options: str = _env_text("CUTEDSL_INDUCTOR_COMPILE_OPTIONS", "", check_compile_options)
# How many GEMM configs the heuristic offers per shape, and whether to offer all.
gemm_max_configs: int = _env_int("CUTEDSL_INDUCTOR_GEMM_MAX_CONFIGS", 8, 1, 1024)
gemm_exhaustive: bool = _env_bool("CUTEDSL_INDUCTOR_GEMM_EXHAUSTIVE", False)
# Fuse pointwise consumers into templates that define an epilogue (``def_epilogue``), and
# (with CUTEDSL a max-autotune GEMM backend) SwiGLU's two GEMMs into one
# (``inductor/swiglu.py``).
epilogue_fusion: bool = _env_bool("CUTEDSL_INDUCTOR_EPILOGUE_FUSION", False)
# Under max-autotune, how many of our fastest choices for a GEMM with a pointwise consumer
# are timed again with that epilogue fused, and for SwiGLU's fused GEMM again, in
# interleaved rounds; the fastest is taken (< 2: no retiming).
fused_choice_candidates: int = _env_int("CUTEDSL_INDUCTOR_FUSED_CHOICE_CANDIDATES", 3, 0, 64)
# Processes that compile the choices Inductor precompiles (0: compile in this process,
# one kernel at a time: CuTe's compiler is not re-entrant); at most one per CPU.
_CPUS = os.cpu_count() or 1
_HALF_THE_CPUS = min(8, _CPUS // 2)
compile_workers: int = _env_int("CUTEDSL_INDUCTOR_COMPILE_WORKERS",
                                _HALF_THE_CPUS if _HALF_THE_CPUS >= 2 else 0, 0, _CPUS)

# Before the first timing of an autotuning that has our choices, run that choice this
# many milliseconds untimed, so that no choice is timed at the clock an idle GPU boosts
# to (``autotune/select.py``); 0: off.
autotune_settle_ms: int = _env_int("CUTEDSL_INDUCTOR_AUTOTUNE_SETTLE_MS", 300, 0, 60000)

# The remote tier under the disk cache (``compile/remote_cache.py``): kernels and tuning
# decisions fetched from and published to Redis, at Inductor's Redis address.
remote_cache: bool = _env_bool("CUTEDSL_INDUCTOR_REMOTE_CACHE", False)
# The longest one Redis operation may wait (to connect, and for each reply).
remote_cache_timeout_ms: int = _env_int("CUTEDSL_INDUCTOR_REMOTE_CACHE_TIMEOUT_MS", 1000, 1,
                                        60000)
# A file holding the secret a fleet shares: with it, remote entries are sealed (HMAC) and
# only sealed ones load (the trust model: ``compile/portable.py``).
remote_cache_secret_file: str | None = _raw("CUTEDSL_INDUCTOR_REMOTE_CACHE_SECRET_FILE")
redis_url: str | None = _env_text("TORCHINDUCTOR_REDIS_URL", None, check_redis_url)
redis_host: str = _raw("TORCHINDUCTOR_REDIS_HOST") or "localhost"
redis_port: int = _env_int("TORCHINDUCTOR_REDIS_PORT", 6379, 1, 65535)


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
    "remote_cache",
    "remote_cache_timeout_ms",
    "remote_cache_secret_file",
    "redis_url",
    "redis_host",
    "redis_port",
)


def snapshot() -> dict[str, Any]:
    """The knobs that change generated code or binaries (goes into cache keys)."""
    return {"entry_suffix": entry_suffix, "compile_options": compile_options,
            "arch": arch, "gemm_max_configs": gemm_max_configs,
            "gemm_exhaustive": gemm_exhaustive, "epilogue_fusion": epilogue_fusion,
            "fused_choice_candidates": fused_choice_candidates}
