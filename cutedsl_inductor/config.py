"""Every knob of cutedsl_inductor, each with an environment-variable mirror.

A knob is read from its env var once, at import, and may be changed afterwards by
assignment (``cutedsl_inductor.config.arch = "sm_90a"``) or temporarily with
``config.patch(name=value)``. Nothing else in the package reads the environment.

``KNOBS`` is the one list of them: each ``Knob`` says its variable, default, parser and
what it does, and two things about the code it steers. ``changes_code``: generated code
(output code, kernels) depends on it, so ``snapshot(reach)`` -- part of Inductor's FX
graph cache key for a graph our code reaches (``inductor/cache_key.py``) -- holds it where
what it ``steers`` (our GEMM, our FlexAttention, templates served by custom lowerings) is
reached. ``locates_binary``: finding or building a kernel's binary depends on it, so a
benchmark request carries it to Inductor's tuning process (``binary_knobs()``).
docs/configuration.md's table is ``docs_table()``.

An assignment is checked as the environment is: an unknown name, or a value of the wrong
type or one the knob's parser refuses, raises ``ConfigError`` naming it (the module's
class is ``_CheckedModule``; ``patch`` checks the same way).

The Redis address is Inductor's own (its remote caches read the same variables), so one
setting serves both.

Environment values are parsed strictly (``knob_parsers``; empty means the default):
anything else raises ``ConfigError``, naming the variable and what it accepts, when the
package is imported.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import enum
import os
import sys
import types
from collections.abc import Iterator
from typing import Any

from .exc import UnknownKnobError
from .knob_parsers import (
    REDIS_URL_ACCEPTED,
    RESERVED_OPTIONS,
    TAKEN_SUFFIXES,
    Boolean,
    Integer,
    Mode,
    Parser,
    Pattern,
    Text,
    check_compile_options,
    check_entry_suffix,
    check_redis_url,
)

class Reach(enum.Flag):
    """Code of ours that a graph can reach (``inductor/cache_key.py``) and that a knob
    steers: the GEMM's choices, FlexAttention's, templates a custom lowering offers (a
    user's, the ``cutedsl::add`` example), and SDPA's choice set."""

    GEMM = enum.auto()
    FLEX = enum.auto()
    TEMPLATES = enum.auto()
    SDPA = enum.auto()  # scaled_dot_product_attention, which ``config.sdpa`` rewrites
    ALL = GEMM | FLEX | TEMPLATES | SDPA


@dataclasses.dataclass(frozen=True)
class Knob:
    name: str
    env: tuple[str, ...]  # read in order; the first one set gives the value
    default: Any
    parse: Parser  # (text, variable) -> value, ConfigError when refused; .doc: what it takes
    doc: str
    default_doc: str = ""  # for the docs, where the default depends on the machine
    changes_code: bool = False
    steers: Reach = Reach.ALL  # whose code it changes, where changes_code
    locates_binary: bool = False

    def read(self) -> Any:
        for variable in self.env:
            raw = os.environ.get(variable, "").strip()
            if raw:
                return self.parse(raw, variable)
        return self.default

    def check(self, value: Any) -> Any:
        """An assigned value as the knob takes it, else ``ConfigError`` naming it."""
        if value is None and self.default is None:
            return None
        return self.parse.value(value, f"config.{self.name}")


KNOBS: dict[str, Knob] = {}  # name -> Knob, in the order they are defined below


def _knob(name: str, env: str | tuple[str, ...], default: Any, parse: Parser, doc: str,
          **flags: Any) -> Any:
    """Register a knob and return its value from the environment."""
    knob = Knob(name, (env,) if isinstance(env, str) else env, default, parse, doc, **flags)
    KNOBS[name] = knob
    return knob.read()


_ANY_TEXT = Text(lambda raw, variable: raw, "a folder")
_CPUS = os.cpu_count() or 1
_HALF_THE_CPUS = min(8, _CPUS // 2)

cache_dir: str | None = _knob(
    "cache_dir", "CUTEDSL_INDUCTOR_CACHE_DIR", None, _ANY_TEXT,
    "the compiled-kernel cache", default_doc="<inductor cache dir>/cutedsl",
    locates_binary=True)
disk_cache: bool = _knob(
    "disk_cache", "CUTEDSL_INDUCTOR_DISK_CACHE", True, Boolean(),
    "export compiled kernels to `cache_dir` and load them from there", locates_binary=True)
arch: str | None = _knob(
    "arch", ("CUTEDSL_INDUCTOR_ARCH", "CUTE_DSL_ARCH"), None,
    Pattern(r"sm_[0-9]+[af]?", "a GPU arch such as sm_90a or sm_100a"),
    "the GPU architecture kernels are compiled for", default_doc="the GPU's, else sm_90a",
    changes_code=True, locates_binary=True)
entry_suffix: str = _knob(
    "entry_suffix", "CUTEDSL_INDUCTOR_ENTRY_SUFFIX", "main",
    Text(check_entry_suffix, "letters, digits and _, other than "
         + ", ".join(f"`{name}`" for name in TAKEN_SUFFIXES)),
    "`def_kernel` defines `<kernel_name>_<entry_suffix>`",
    changes_code=True, locates_binary=True)
compile_options: str = _knob(
    "compile_options", "CUTEDSL_INDUCTOR_COMPILE_OPTIONS", "",
    Text(check_compile_options, "`cute.compile` options but "
         + ", ".join(f"`--{option}`" for option in RESERVED_OPTIONS)),
    "extra options for `cute.compile`", changes_code=True, locates_binary=True)
gemm_max_configs: int = _knob(
    "gemm_max_configs", "CUTEDSL_INDUCTOR_GEMM_MAX_CONFIGS", 8, Integer(1, 1024),
    "GEMM configs the heuristic offers per shape", changes_code=True, steers=Reach.GEMM)
gemm_exhaustive: bool = _knob(
    "gemm_exhaustive", "CUTEDSL_INDUCTOR_GEMM_EXHAUSTIVE", False, Boolean(),
    "offer every GEMM config the kernel can run", changes_code=True, steers=Reach.GEMM)
gemm_pdl: bool = _knob(
    "gemm_pdl", "CUTEDSL_INDUCTOR_GEMM_PDL", False, Boolean(),
    "launch the GEMM with programmatic dependent launch, its setup overlapping the previous "
    "kernel's end", changes_code=True, steers=Reach.GEMM)
fp8: bool = _knob(
    "fp8", "CUTEDSL_INDUCTOR_FP8", False, Boolean(),
    "offer our FP8 GEMM (e4m3/e5m2, tensorwise or rowwise scales, fast accumulation) in "
    "`torch._scaled_mm`'s lowering next to ATen and Triton (`inductor/scaled_mm.py`; off "
    "until timed on the GPU)", changes_code=True, steers=Reach.GEMM)
fp8_swiglu: bool = _knob(
    "fp8_swiglu", "CUTEDSL_INDUCTOR_FP8_SWIGLU", False, Boolean(),
    "with `epilogue_fusion`, rewrite SwiGLU's two FP8 GEMMs (`silu(_scaled_mm(x, w1)) * "
    "_scaled_mm(x, w3)`, x quantized once or twice alike; fast accumulation) into one "
    "two-weight FP8 GEMM (`inductor/scaled_swiglu.py`; off until timed on the GPU)",
    changes_code=True, steers=Reach.GEMM)
epilogue_fusion: bool = _knob(
    "epilogue_fusion", "CUTEDSL_INDUCTOR_EPILOGUE_FUSION", True, Boolean(),
    "fuse pointwise consumers into templates with `def_epilogue`, and SwiGLU's two GEMMs "
    "into one", changes_code=True, steers=Reach.GEMM | Reach.TEMPLATES)
prologue_fusion: bool = _knob(
    "prologue_fusion", "CUTEDSL_INDUCTOR_PROLOGUE_FUSION", False, Boolean(),
    "fuse a pointwise producer of a GEMM's activation (a cast, a scale, RMSNorm's weight) "
    "into its load path where timing says it pays (templates with `def_prologue`)",
    changes_code=True, steers=Reach.GEMM | Reach.TEMPLATES)
fused_choice_candidates: int = _knob(
    "fused_choice_candidates", "CUTEDSL_INDUCTOR_FUSED_CHOICE_CANDIDATES", 3, Integer(0, 64),
    "our fastest GEMM choices timed again with their epilogue fused (< 2: none)",
    changes_code=True, steers=Reach.GEMM | Reach.TEMPLATES)
flex_attention: bool = _knob(
    "flex_attention", "CUTEDSL_INDUCTOR_FLEX_ATTENTION", False, Boolean(),
    "offer our FlexAttention forward and backward in every flex_attention (and "
    "flex_attention_backward) lowering (one call: "
    "`kernel_options={\"CUTEDSL\": True}`), timed against Inductor's Triton kernel",
    changes_code=True, steers=Reach.FLEX)
flex_max_configs: int = _knob(
    "flex_max_configs", "CUTEDSL_INDUCTOR_FLEX_MAX_CONFIGS", 2, Integer(1, 8),
    "FlexAttention configs offered per lowering", changes_code=True, steers=Reach.FLEX)
flex_only_ours: bool = _knob(
    "flex_only_ours", "CUTEDSL_INDUCTOR_FLEX_ONLY_OURS", False, Boolean(),
    "where our FlexAttention is switched on, offer it alone (Inductor's Triton choices "
    "dropped; a problem ours refuses fails to compile, naming why): what `bench attention` "
    "times", changes_code=True, steers=Reach.FLEX)
flex_pipelined: bool = _knob(
    "flex_pipelined", "CUTEDSL_INDUCTOR_FLEX_PIPELINED", True, Boolean(),
    "our FlexAttention kernels overlap their softmax with their GEMMs (forward: S_t with "
    "P_{t-1} V; backward dK/dV: P^T with dP^T, dS^T with dV; off: the serial loops, to "
    "compare)", changes_code=True, steers=Reach.FLEX)
flex_pingpong: bool = _knob(
    "flex_pingpong", "CUTEDSL_INDUCTOR_FLEX_PINGPONG", True, Boolean(),
    "our FlexAttention forward's two consumer warpgroups take turns issuing their GEMMs "
    "(named barriers: one's softmax runs while the other's GEMMs do; pipelined mainloop "
    "only; faster on every mask timed, docs/measurements.md)", changes_code=True,
    steers=Reach.FLEX)
flex_persistent: str = _knob(
    "flex_persistent", "CUTEDSL_INDUCTOR_FLEX_PERSISTENT", "choice", Mode(("off", "on", "choice")),
    "our FlexAttention forward persistent (one CTA per SM walks the Q tiles in a snake "
    "order, loading the next tile's Q, K and V while one tile's last P V and store run): "
    "`choice` offers the first config's persistent twin as one choice more, autotuning "
    "decides (it wins causal and ALiBi, loses document masking: docs/measurements.md); "
    "`on` every config persistent, `off` none", changes_code=True, steers=Reach.FLEX)
flex_fold_scale: bool = _knob(
    "flex_fold_scale", "CUTEDSL_INDUCTOR_FLEX_FOLD_SCALE", True, Boolean(),
    "where the score_mod is the identity and sm_scale > 0, our FlexAttention forward folds "
    "sm_scale into the exp2's FFMA (row max of the raw scores: 64 FMULs a thread and KV "
    "tile fewer; 2-3% faster on causal, sliding and document masks)", changes_code=True,
    steers=Reach.FLEX)
flex_bwd_fused_dq: bool = _knob(
    "flex_bwd_fused_dq", "CUTEDSL_INDUCTOR_FLEX_BWD_FUSED_DQ", False, Boolean(),
    "our FlexAttention backward in one kernel: dQ accumulated by the dK/dV kernel (TMA "
    "reduce-adds into a zeroed fp32 workspace of B*H*Q_LEN*D floats, then cast), five "
    "GEMMs per tile pair instead of the dQ kernel's three more (off until faster, "
    "docs/measurements.md)", changes_code=True, steers=Reach.FLEX)
flex_bwd_lpt: bool = _knob(
    "flex_bwd_lpt", "CUTEDSL_INDUCTOR_FLEX_BWD_LPT", False, Boolean(),
    "our FlexAttention backward's dK/dV CTAs start longest first: a 1-D grid, heads in "
    "sections whose Q and dO fit in L2, each section's KV tile 0 of every head first (under "
    "a causal mask the tiles with the most Q steps), so the last wave holds short CTAs "
    "(FlashAttention-3's causal backward order; off until timed, docs/measurements.md)",
    changes_code=True, steers=Reach.FLEX)
flex_bwd_early_s: bool = _knob(
    "flex_bwd_early_s", "CUTEDSL_INDUCTOR_FLEX_BWD_EARLY_S", False, Boolean(),
    "our FlexAttention backward's dK/dV step issues its S^T GEMM before waiting for the last "
    "step's dV and dK GEMMs (released a step late), so the tensor cores do not drain between "
    "steps (pipelined two-kernel backward only: ignored with `flex_bwd_fused_dq` or "
    "`flex_pipelined` off; off until timed, docs/measurements.md)",
    changes_code=True, steers=Reach.FLEX)
sdpa: bool = _knob(
    "sdpa", "CUTEDSL_INDUCTOR_SDPA", False, Boolean(),
    "under max-autotune with CUTEDSL among the GEMM backends, on sm_90, "
    "`scaled_dot_product_attention`'s forward and backward are autotuned over every "
    "eligible ATen backend (flash, cuDNN, efficient) and our FlexAttention kernels "
    "(`inductor/sdpa_pass.py`; 1.87x of SDPA's default on an H100, its GPU tests pass: "
    "off until timed in `bench model`'s models, docs/measurements.md)",
    changes_code=True, steers=Reach.SDPA)
aot: bool = _knob(
    "aot", "CUTEDSL_INDUCTOR_AOT", False, Boolean(),
    "under Inductor's C++ wrapper (cpp_wrapper, AOTInductor) our choices are offered and the "
    "C++ code launches the winners' exported libraries, shipped in the package "
    "(docs/aot.md; off until verified on the GPU)", changes_code=True)
distributed_autotune: bool = _knob(
    "distributed_autotune", "CUTEDSL_INDUCTOR_DISTRIBUTED_AUTOTUNE", False, Boolean(),
    "under Inductor's distributed autotuning (`TORCHINDUCTOR_DISTRIBUTED_MAX_AUTOTUNE_GEMM=1`: "
    "the ranks of a torch.distributed job split the mm nodes to autotune) our GEMM choices "
    "take part, a rank's winner of ours rebuilt on the others and loaded from the kernel "
    "cache (docs/distributed.md; off: not offered for those mm nodes; off until verified on "
    "several GPUs)", changes_code=True, steers=Reach.GEMM)
compile_workers: int = _knob(
    "compile_workers", "CUTEDSL_INDUCTOR_COMPILE_WORKERS",
    _HALF_THE_CPUS if _HALF_THE_CPUS >= 2 else 0, Integer(0, _CPUS, high_doc="the CPUs"),
    "processes compiling the choices Inductor precompiles (0: in this process)",
    default_doc="half the CPUs, at most 8; 0 below 4 CPUs")
compile_worker_timeout_s: int = _knob(
    "compile_worker_timeout_s", "CUTEDSL_INDUCTOR_COMPILE_WORKER_TIMEOUT_S", 300,
    Integer(1, 86400),
    "the longest a compile worker is waited for, to start or to build one kernel: one that "
    "does not answer by then is killed and its kernel built by another "
    "(`runtime/workers.py`)")
compile_prefetch: bool = _knob(
    "compile_prefetch", "CUTEDSL_INDUCTOR_COMPILE_PREFETCH", False, Boolean(),
    "our choices start building in the compile workers when they are made, not when "
    "their op is autotuned (`runtime/workers.py`; off until timed on the H200)")
upstream_fast_path: bool = _knob(
    "upstream_fast_path", "CUTEDSL_INDUCTOR_UPSTREAM_FAST_PATH", True, Boolean(),
    "upstream-style templates' `from_dlpack` + `@cute.jit` calls launch through TVM-FFI "
    "(`compile/upstream.py`; read when a module first loads; off: every call through "
    "CuTe's JitExecutor)")
autotune_settle_ms: int = _knob(
    "autotune_settle_ms", "CUTEDSL_INDUCTOR_AUTOTUNE_SETTLE_MS", 300, Integer(0, 60000),
    "ms our first choice runs untimed before an autotuning's first timing (0: off)")
coordesc_recheck: bool = _knob(
    "coordesc_recheck", "CUTEDSL_INDUCTOR_COORDESC_RECHECK", True, Boolean(),
    "a warm process runs the coordinate-descent configs an earlier one cached for its "
    "Triton kernels instead of tuning them again at their first launch, where torch 2.11 "
    "or Triton's Config pickling loses them (`inductor/coordesc.py`)")
remote_cache: bool = _knob(
    "remote_cache", "CUTEDSL_INDUCTOR_REMOTE_CACHE", False, Boolean(),
    "a Redis tier under the disk cache: kernels and tuning decisions fetched and published "
    "(`compile/cache/remote_cache.py`)", locates_binary=True)
remote_cache_timeout_ms: int = _knob(
    "remote_cache_timeout_ms", "CUTEDSL_INDUCTOR_REMOTE_CACHE_TIMEOUT_MS", 1000,
    Integer(1, 60000), "the longest one Redis operation waits (to connect, for each reply)",
    locates_binary=True)
remote_cache_secret_file: str | None = _knob(
    "remote_cache_secret_file", "CUTEDSL_INDUCTOR_REMOTE_CACHE_SECRET_FILE", None,
    Text(lambda raw, variable: raw, "a file"),
    "the fleet's shared secret: remote entries are sealed and only sealed ones load "
    "(`compile/cache/portable.py`)", locates_binary=True)
redis_url: str | None = _knob(
    "redis_url", "TORCHINDUCTOR_REDIS_URL", None,
    Text(check_redis_url, REDIS_URL_ACCEPTED),
    "Inductor's Redis address (its remote caches read it too)",
    locates_binary=True)
redis_host: str = _knob(
    "redis_host", "TORCHINDUCTOR_REDIS_HOST", "localhost", Text(lambda raw, variable: raw,
                                                                "a host name"),
    "Inductor's Redis host, where no `redis_url`", locates_binary=True)
redis_port: int = _knob(
    "redis_port", "TORCHINDUCTOR_REDIS_PORT", 6379, Integer(1, 65535),
    "Inductor's Redis port, where no `redis_url`", locates_binary=True)


@contextlib.contextmanager
def patch(**changes: Any) -> Iterator[None]:
    """Temporarily set knobs: ``with config.patch(disk_cache=False): ...`` (each checked
    as an assignment is)."""
    checked = {name: knob(name).check(value) for name, value in changes.items()}
    module = globals()
    saved = {name: module[name] for name in checked}
    module.update(checked)
    try:
        yield
    finally:
        module.update(saved)


def knob(name: str) -> Knob:
    """The knob ``name``, else ``ConfigError`` naming it (and the knobs it is close to)."""
    if name in KNOBS:
        return KNOBS[name]
    close = difflib.get_close_matches(name, KNOBS, n=1)
    raise UnknownKnobError(name=name, hint=f" (did you mean {close[0]!r}?)" if close else "")


def snapshot(reach: Reach = Reach.ALL) -> dict[str, Any]:
    """The knobs that change the generated code of what ``reach`` names (in Inductor's FX
    graph cache key of a graph our code reaches)."""
    return {name: globals()[name] for name, knob in KNOBS.items()
            if knob.changes_code and knob.steers & reach}


def binary_knobs() -> dict[str, Any]:
    """The knobs that locate a kernel's binary: another process set to them finds or
    builds the binary this one would."""
    return {name: globals()[name] for name, knob in KNOBS.items() if knob.locates_binary}


def docs_table() -> str:
    """The knobs as a Markdown table (the README's)."""
    rows = ["| knob | environment variable | default | accepts | what it does |",
            "|---|---|---|---|---|"]
    for knob in KNOBS.values():
        env = f"`{knob.env[0]}`" + "".join(f" (else `{other}`)" for other in knob.env[1:])
        default = knob.default_doc or f"`{knob.default!r}`"
        rows.append(f"| `{knob.name}` | {env} | {default} | {knob.parse.doc} | {knob.doc} |")
    return "\n".join(rows)


class _CheckedModule(types.ModuleType):
    """This module, whose attribute assignments are checked: a knob's value by its knob
    (``Knob.check``), any other name only where the module has it already (a function a
    test replaces)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in KNOBS or not hasattr(self, name):
            value = knob(name).check(value)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _CheckedModule
