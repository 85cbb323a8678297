"""``bench model``'s first-call breakdown: where a variant's first call spent its seconds,
from what torch, Triton and this package count as they go (no profiler).

``Recorder()`` is made just before the first call: it takes a snapshot of every source
and installs four cheap hooks, once per process: a timer around Inductor's
``RemoteCache.get`` / ``put`` (per cache class: FX graph, AOTAutograd, autotune, ours);
Triton's compilation listener (``triton.knobs.compilation.listener``, chained to any
listener already there); a timer around each kernel's coordinate descent
(``CachingAutotuner.coordinate_descent_tuning``, run at a Triton kernel's first launch
under max-autotune: in the first call's rest, not in its compile); and a feedback saver
(Inductor's hook, called with each autotuning's timings) that notes, where our choices
were timed, whether one of ours was fastest and the rank of our fastest in the order the
heuristic offered them: what offering fewer configs would have lost.
``columns(first_call_s)`` after the call gives the ``fc_*`` columns, each the difference
over the call. A source this torch or Triton lacks leaves its columns None (an empty CSV
cell), never an error.

Torch's figures are the sums of its ``dynamo_timed`` regions
(``torch._dynamo.utils.compilation_time_metrics``, in torch 2.11 and 2.13 alike) and its
``counters``. They nest rather than add up: the first call is torch's compile (each
frame's ``_compile.compile_inner`` plus a backward compiled lazily in the first step,
``backward._backward_impl``: the two torch adds for its ``total_wall_time``) and the rest
(the run itself, CUDA and cuBLAS initialisation, guards). Within the compile: Dynamo's own
share (the compile less its backend call, ``OutputGraph.call_user_compiler``), Inductor's
compile of each graph (``compile_fx_inner``: a cache miss's codegen and autotuning), the
cached graph's load (``AOTAutogradCache.inductor_load``), the output modules' load
(``PyCodeCache.load_by_key_path``: it runs our ``load_kernel`` calls and Triton's kernel
loads), autotuning, and the wait for Triton's compile workers (``async_compile.wait``).
Ours (``counters.py``: kernels, loads, the remote tier, decisions, workers) falls inside
the compile.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from ..autotune.benchmark_request import CuteDSLBenchmarkRequest
from .. import counters
from ..compile.cache import remote_backend

# column -> the dynamo_timed keys it sums (seconds)
TORCH_TIMES = {
    "fc_frame_compile_s": ("_compile.compile_inner",),
    "fc_backward_compile_s": ("backward._backward_impl",),
    "fc_backend_s": ("OutputGraph.call_user_compiler",),
    "fc_trace_s": ("bytecode_tracing",),
    "fc_inductor_s": ("compile_fx_inner",),
    "fc_cache_load_s": ("AOTAutogradCache.inductor_load",),
    "fc_output_code_s": ("PyCodeCache.load_by_key_path",),
    "fc_triton_wait_s": ("async_compile.wait",),
    "fc_triton_bundle_s": ("TritonBundler.read_and_emit",
                           "TritonBundler.load_cached_static_autotuners"),
}
AUTOTUNE_SUFFIXES = ("_template_autotuning", "_template_precompiling")
# regions around a whole compile, left out of ``fc_torch_top`` (what they hold is shown)
_CONTAINERS = frozenset((
    "_compile.compile_inner", "compile_attempt_0", "OutputGraph.call_user_compiler",
    "create_aot_dispatcher_function", "compile_fx.<locals>.fw_compiler_base",
    "compile_fx.<locals>.bw_compiler", "backward._backward_impl", "compile_fx_inner",
    "fx_codegen_and_compile", "GraphLowering.compile_to_fn", "GraphLowering.compile_to_module"))
# column -> (counters group, name)
TORCH_COUNTS = {
    "fc_fx_cache_hits": ("inductor", "fxgraph_cache_hit"),
    "fc_fx_cache_misses": ("inductor", "fxgraph_cache_miss"),
    "fc_aot_cache_hits": ("aot_autograd", "autograd_cache_hit"),
    "fc_aot_cache_misses": ("aot_autograd", "autograd_cache_miss"),
    "fc_triton_bundled": ("inductor", "triton_bundler_read_and_emit_kernel"),
}
# column -> (its group in ``counters``, name): read when used (tests replace the groups)
OURS = {
    "fc_load_kernel_calls": ("loads", "calls"),
    "fc_load_kernel_s": ("loads", "seconds"),
    "fc_cute_memory": ("kernels", "memory_hits"),
    "fc_cute_disk": ("kernels", "disk_hits"),
    "fc_cute_disk_s": ("kernels", "disk_load_s"),
    "fc_cute_remote": ("kernels", "remote_hits"),
    "fc_cute_remote_fetch_s": ("kernels", "remote_fetch_s"),
    "fc_cute_remote_adopt_s": ("kernels", "remote_adopt_s"),
    "fc_cute_compiled": ("kernels", "compiled"),
    "fc_cute_compile_s": ("kernels", "compile_s"),
    "fc_redis_round_trips": ("remote", "round_trips"),
    "fc_redis_bytes_read": ("remote", "bytes_read"),
    "fc_redis_bytes_written": ("remote", "bytes_written"),
    "fc_redis_s": ("remote", "seconds"),
    "fc_decisions_local": ("decisions", "local_hits"),
    "fc_decisions_remote": ("decisions", "remote_hits"),
    "fc_decisions_missed": ("decisions", "misses"),
    "fc_decisions_s": ("decisions", "lookup_s"),
    "fc_workers_started": ("workers", "started"),
    "fc_workers_startup_s": ("workers", "startup_s"),
    "fc_workers_ready_wait_s": ("workers", "ready_wait_s"),
    "fc_workers_queue_wait_s": ("workers", "queue_wait_s"),
    "fc_worker_builds": ("workers", "builds"),
    "fc_worker_build_s": ("workers", "build_s"),
}
# columns made from the others (None where torch keeps no times)
DERIVED = ("fc_compile_s", "fc_rest_s", "fc_dynamo_s", "fc_autotune_s", "fc_torch_top")
OUR_REMOTE_CACHE = remote_backend.CuteDSLRemoteCache.__name__
log = logging.getLogger(__name__)

# what the hooks count: "get <cache class>" / "put <cache class>" -> [calls, seconds],
# "triton compiled" / "triton cache hit" -> [calls, seconds of triton.compile], and
# "coordesc <kernel>" -> [tunings, seconds], "our rank <k>" / "ours won" -> [autotunings, 0]
_hooked: dict[str, list[float]] = {}
_lock = threading.Lock()


def _count(name: str, seconds: float) -> None:
    with _lock:
        entry = _hooked.setdefault(name, [0, 0.0])
        entry[0] += 1
        entry[1] += seconds


def _timed(method: Callable[..., Any], label: Callable[[Any], str]) -> Callable[..., Any]:
    """``method``, its calls and seconds counted under ``label(self)``."""
    @functools.wraps(method)
    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            _count(label(self), time.perf_counter() - start)

    return timed


def _cache_label(action: str, cache: Any) -> str:
    return f"{action} {type(cache).__name__}"


def _kernel_label(autotuner: Any) -> str:
    return f"coordesc {getattr(getattr(autotuner, 'fn', None), '__name__', '?')}"


def _note_our_ranks(timings: dict[Any, float], _name: str, _nodes: Any, choices: list[Any],
                    *_rest: Any) -> None:
    """A feedback saver: where our choices were timed, the rank of our fastest among
    ours (their order in the list is the heuristic's) and whether it was fastest of all."""
    ours = [c for c in choices if isinstance(getattr(c, "bmreq", None), CuteDSLBenchmarkRequest)]
    timed = {c: ms for c, ms in timings.items() if math.isfinite(ms)}
    our_timed = [c for c in ours if c in timed]
    if not our_timed:
        return
    best = min(our_timed, key=timed.__getitem__)
    _count(f"our rank {ours.index(best) + 1}", 0.0)
    if min(timed, key=timed.__getitem__) is best:
        _count("ours won", 0.0)


@functools.cache
def install_hooks() -> None:
    """The timers on Inductor's remote caches and coordinate descent, and Triton's
    listener (each where it exists)."""
    from torch._inductor import select_algorithm
    from torch._inductor.remote_cache import RemoteCache
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    select_algorithm.add_feedback_saver(_note_our_ranks)

    for action in ("get", "put"):
        method = getattr(RemoteCache, action, None)
        if method is not None:
            setattr(RemoteCache, action,
                    _timed(method, functools.partial(_cache_label, action)))
    tuning = getattr(CachingAutotuner, "coordinate_descent_tuning", None)
    if tuning is not None:
        CachingAutotuner.coordinate_descent_tuning = _timed(tuning, _kernel_label)
    try:
        from triton import knobs
    except ImportError:
        return
    compilation = getattr(knobs, "compilation", None)
    if compilation is None or not hasattr(compilation, "listener"):
        return
    previous = compilation.listener

    def listener(**kwargs: Any) -> None:
        total_us = getattr(kwargs.get("times"), "total", 0) or 0
        metadata = kwargs.get("metadata")
        name = (metadata.get("name") if isinstance(metadata, dict) else None) or getattr(
            kwargs.get("src"), "name", "?")
        _count(f"triton {'cache hit' if kwargs.get('cache_hit') else 'compiled'} {name}",
               total_us / 1e6)
        if previous is not None:
            previous(**kwargs)

    compilation.listener = listener


def _torch_times() -> dict[str, float]:
    """Every dynamo_timed key's seconds so far; {} where this torch keeps none."""
    try:
        from torch._dynamo.utils import compilation_time_metrics
        return {key: float(sum(values)) for key, values in compilation_time_metrics.items()}
    except Exception:
        return {}


def _torch_counts() -> dict[tuple[str, str], int] | None:
    try:
        from torch._dynamo.utils import counters
        return {(group, name): int(counters[group][name])
                for group, name in TORCH_COUNTS.values()}
    except Exception:
        return None


def _snapshot() -> dict[str, Any]:
    return {"times": _torch_times(), "counts": _torch_counts(),
            "ours": {column: float(getattr(getattr(counters, group), name))
                     for column, (group, name) in OURS.items()},
            "hooked": {name: list(entry) for name, entry in _hooked.items()}}


def _since(after: float, before: float) -> float:
    """A difference of two running sums (torch's can be cleared between: then ``after``)."""
    return after - before if after >= before else after


class Recorder:
    """Snapshots at the start of a first call; ``columns`` is what the call added."""

    def __init__(self) -> None:
        try:
            install_hooks()
        except Exception as err:  # a torch without them: their columns stay 0
            log.warning("first-call hooks not installed (%s: %s)", type(err).__name__, err)
        self.before = _snapshot()

    def columns(self, first_call_s: float) -> dict[str, Any]:
        before, now = self.before, _snapshot()
        row: dict[str, Any] = dict.fromkeys([*TORCH_TIMES, *DERIVED, *TORCH_COUNTS])
        times = {key: _since(value, before["times"].get(key, 0.0))
                 for key, value in now["times"].items()}
        if times:
            for column, keys in TORCH_TIMES.items():
                row[column] = sum(times.get(key, 0.0) for key in keys)
            compile_s = row["fc_frame_compile_s"] + row["fc_backward_compile_s"]
            top = sorted(((key, s) for key, s in times.items() if key not in _CONTAINERS),
                         key=lambda item: -item[1])[:8]
            row.update(
                fc_compile_s=compile_s, fc_rest_s=first_call_s - compile_s,
                fc_dynamo_s=row["fc_frame_compile_s"] - row["fc_backend_s"],
                fc_autotune_s=sum(s for key, s in times.items()
                                  if key.endswith(AUTOTUNE_SUFFIXES)),
                fc_torch_top="; ".join(f"{key} {s:.2f}" for key, s in top if s >= 0.01))
        if now["counts"] is not None and before["counts"] is not None:
            row.update({column: now["counts"][key] - before["counts"][key]
                        for column, key in TORCH_COUNTS.items()})
        row.update({column: value - before["ours"][column]
                    for column, value in now["ours"].items()})
        row.update(_hooked_columns(before["hooked"], now["hooked"]))
        return row


def _hooked_columns(before: dict[str, list[float]], now: dict[str, list[float]]
                    ) -> dict[str, Any]:
    """The hooks' columns: Inductor's remote caches (ours apart) and Triton's compiles."""
    added = {name: (count - before.get(name, [0, 0.0])[0], s - before.get(name, [0, 0.0])[1])
             for name, (count, s) in now.items()}
    added = {name: value for name, value in added.items() if value[0]}

    def total(prefix: str, index: int) -> float:
        return sum(v[index] for name, v in added.items()
                   if name.startswith(prefix) and not name.endswith(OUR_REMOTE_CACHE))

    remote = "; ".join(f"{name} {count} {s:.3f}s" for name, (count, s) in sorted(added.items())
                       if name.startswith(("get ", "put ")))
    return {"fc_inductor_remote_gets": total("get ", 0),
            "fc_inductor_remote_get_s": total("get ", 1),
            "fc_inductor_remote_puts": total("put ", 0),
            "fc_inductor_remote_put_s": total("put ", 1),
            "fc_remote_by_cache": remote or None,
            "fc_triton_compiled": total("triton compiled", 0),
            "fc_triton_compiled_kernels": _most_compiled(added),
            "fc_triton_cache_hits": total("triton cache hit", 0),
            "fc_triton_compile_s": total("triton ", 1),
            "fc_coordesc": sum(name.startswith("coordesc ") for name in added),
            "fc_coordesc_s": total("coordesc ", 1),
            "fc_coordesc_kernels": _slowest_tuned(added),
            "fc_our_autotunings": total("our rank ", 0),
            "fc_ours_won": total("ours won", 0),
            "fc_our_best_ranks": " ".join(
                f"#{rank}:{count}" for rank, count in sorted(
                    (int(name.rsplit(" ", 1)[1]), count) for name, (count, _) in added.items()
                    if name.startswith("our rank "))) or None}


def _slowest_tuned(added: dict[str, tuple[int, float]], top: int = 6) -> str | None:
    """The kernels whose coordinate descent took longest in the call, with seconds."""
    prefix = "coordesc "
    tuned = sorted(((name[len(prefix):], s) for name, (_, s) in added.items()
                    if name.startswith(prefix)), key=lambda item: (-item[1], item[0]))
    return "; ".join(f"{name} {s:.2f}s" for name, s in tuned[:top]) or None


def _most_compiled(added: dict[str, tuple[int, float]], top: int = 6) -> str | None:
    """The kernels Triton compiled most often in the call, with their counts: a kernel
    compiled many times in a warm process is one Inductor's coordinate descent re-tuned
    (each config it tries is a compile)."""
    prefix = "triton compiled "
    counts = sorted(((name[len(prefix):], count) for name, (count, _) in added.items()
                     if name.startswith(prefix)), key=lambda item: (-item[1], item[0]))
    return "; ".join(f"{name} {count}" for name, count in counts[:top]) or None


def _s(value: Any) -> str:
    return "?" if value is None else f"{value:.2f}"


def _n(value: Any) -> str:
    return "?" if value is None else f"{value:.0f}"


def describe(row: dict[str, Any], warm: bool = False) -> str:
    """One line of a row's first call (``warm``: its warm process's); "" without one."""
    prefix = "warm_" if warm else ""
    r = {key[len(prefix):]: value for key, value in row.items() if key.startswith(prefix)}
    if "fc_compile_s" not in r:
        return ""
    first = row.get("first_call_warm_s" if warm else "first_call_s")
    mb = (r["fc_redis_bytes_read"] + r["fc_redis_bytes_written"]) / 1e6
    return (
        f"{'warm' if warm else 'cold'} {_s(first)} s = compile {_s(r['fc_compile_s'])} [dynamo "
        f"{_s(r['fc_dynamo_s'])}, inductor {_s(r['fc_inductor_s'])}, autotune "
        f"{_s(r['fc_autotune_s'])}, cache load {_s(r['fc_cache_load_s'])} (FX hits "
        f"{_n(r['fc_fx_cache_hits'])}, AOT hits {_n(r['fc_aot_cache_hits'])}), output code "
        f"{_s(r['fc_output_code_s'])}, triton wait {_s(r['fc_triton_wait_s'])}, triton "
        f"{_n(r['fc_triton_compiled'])} compiled / {_n(r['fc_triton_cache_hits'])} hits "
        f"{_s(r['fc_triton_compile_s'])} s, inductor redis {_n(r['fc_inductor_remote_gets'])} "
        f"gets {_s(r['fc_inductor_remote_get_s'])} s] + rest {_s(r['fc_rest_s'])} | ours: "
        f"load_kernel {_n(r['fc_load_kernel_calls'])} {_s(r['fc_load_kernel_s'])} s (memory "
        f"{_n(r['fc_cute_memory'])}, disk {_n(r['fc_cute_disk'])} {_s(r['fc_cute_disk_s'])} s, "
        f"remote {_n(r['fc_cute_remote'])}: fetch {_s(r['fc_cute_remote_fetch_s'])} + adopt "
        f"{_s(r['fc_cute_remote_adopt_s'])} s, compiled {_n(r['fc_cute_compiled'])} "
        f"{_s(r['fc_cute_compile_s'])} s), redis {_n(r['fc_redis_round_trips'])} trips "
        f"{mb:.1f} MB {_s(r['fc_redis_s'])} s, decisions {_n(r['fc_decisions_local'])} local / "
        f"{_n(r['fc_decisions_remote'])} remote {_s(r['fc_decisions_s'])} s, workers "
        f"{_n(r['fc_workers_started'])} ready after {_s(r['fc_workers_startup_s'])} s in all "
        f"(waited for {_s(r['fc_workers_ready_wait_s'])} s, for a free one "
        f"{_s(r['fc_workers_queue_wait_s'])} s), {_n(r['fc_worker_builds'])} builds "
        f"{_s(r['fc_worker_build_s'])} s, cutlass "
        f"{'imported' if r.get('cutlass_imported') else 'not imported'}"
        + (f" | triton compiled most: {r['fc_triton_compiled_kernels']}"
           if r.get("fc_triton_compiled_kernels") else "")
        + (f" | coordesc {_n(r.get('fc_coordesc'))} kernels {_s(r.get('fc_coordesc_s'))} s, "
           f"slowest: {r['fc_coordesc_kernels']}" if r.get("fc_coordesc_kernels") else "")
        + (f" | ours fastest in {_n(r.get('fc_ours_won'))} of {_n(r.get('fc_our_autotunings'))} "
           f"autotunings, rank of our fastest #rank:times {r['fc_our_best_ranks']}"
           if r.get("fc_our_best_ranks") else ""))
