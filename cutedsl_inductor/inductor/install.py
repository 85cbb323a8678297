"""``install()``: what importing the package does to Inductor (idempotent).

It registers ``CuteDSLCombinedScheduling`` for CUDA devices (``cuda_scheduling``: only
the scheduling of the ``DeviceCodegen`` torch registers, made where torch's registration
has not run yet, without importing Inductor's CUDA scheduling: ``combined.py`` says why),
our part of the FX graph cache key
(``cache_key``), our GEMM choices (``choices``), our FlexAttention choice in
flex_attention's lowering (``flex``, off unless asked for), the wrap of ``_scaled_mm``'s
lowering that our FP8 choices read its call from (``scaled_mm``), the clock settling before
autotuning (``autotune/select.py``), our pre-fusion pass (``multi_template``; inside
Inductor's distributed-autotuning step where our choices take part in it:
``distributed.py``) and the SwiGLU rewrite (``swiglu``), and a start of the compile
workers' zygote when dynamo starts a compile with CUTEDSL among the GEMM backends (``runtime/workers.py``; stopped
at the compile's end if it forked no worker, and not started ahead again once a compile
was served from Inductor's caches; ``torch._dynamo.reset()`` clears dynamo's callbacks,
and the workers then start at the first choice that needs them). Each is a no-op for
graphs and lists without our choices, so with CUTEDSL off Inductor's output code is what
it would be without the package; every pass is keyed for the FX graph cache, and only
where a graph reaches our code (``cache_key``: a CPU graph's key is torch's). One change
reaches every graph, at run time, not in its code: a warm process reuses its Triton
kernels' cached coordinate-descent configs instead of tuning them again (``coordesc``:
where torch 2.11 or Triton's Config pickling loses them; knob ``coordesc_recheck``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch._dynamo
from torch._inductor.codegen import common

from ..autotune.select import install_clock_settling
from ..runtime import workers
from .cache_key import cutedsl_gemm_listed, install_cache_key
from .choices import install_choices
from .coordesc import install_coordesc_reuse
from .flex import install_flex
from .multi_template import install_distributed_schedule, install_pre_fusion_pass
from .scaled_mm import install_scaled_mm
from .sdpa import install_sdpa
from .swiglu_pass import install_swiglu


def install() -> None:
    install_cuda_scheduling()  # first: registering "cuda" clears its pass, where swiglu adds ours
    install_cache_key()
    install_choices()
    install_flex()
    install_scaled_mm()
    install_clock_settling()
    install_pre_fusion_pass()
    install_distributed_schedule()
    install_swiglu()
    install_sdpa()
    install_coordesc_reuse()
    install_workers_ahead()


def install_cuda_scheduling() -> None:
    """``cuda_scheduling`` as the "cuda" device's scheduling. Where torch has not registered
    its devices yet, a registration of ours with the wrappers torch's has (the same on
    every supported torch); torch registers a device only where none is, so it keeps it."""
    current = common.device_codegens.get("cuda")
    if current is None:
        from torch._inductor.codegen.cpp_wrapper_gpu import CppWrapperGpu
        from torch._inductor.codegen.wrapper import PythonWrapperCodegen
        from torch._inductor.codegen.wrapper_fxir import WrapperFxCodegen

        common.register_backend_for_device("cuda", cuda_scheduling, PythonWrapperCodegen,
                                           CppWrapperGpu, WrapperFxCodegen)
    elif current.scheduling is not cuda_scheduling:
        common.device_codegens["cuda"] = dataclasses.replace(current, scheduling=cuda_scheduling)


def cuda_scheduling(scheduler: Any) -> Any:
    """Inductor's scheduling for a CUDA graph: ``CuteDSLCombinedScheduling``, its module
    imported at the first graph (``scheduler`` is None where Inductor asks for features)."""
    from .combined import CuteDSLCombinedScheduling

    return CuteDSLCombinedScheduling(scheduler)


def install_workers_ahead() -> None:
    handler = torch._dynamo.callback_handler
    if _start_workers_ahead not in handler.start_callbacks:
        handler.register_start_callback(_start_workers_ahead)
        handler.register_end_callback(_stop_unused_workers)


# Inductor's counters of FX graph cache misses and of cache hits (FX graph, AOTAutograd),
# and their values when the current compile started (dynamo runs one at a time): a compile
# that hit and missed nothing was served from the caches, a warm one
_CACHE_COUNTERS = (("inductor", "fxgraph_cache_miss"), ("inductor", "fxgraph_cache_hit"),
                   ("aot_autograd", "autograd_cache_hit"))
_counts_at_start = (0, 0, 0)


def _cache_counts() -> tuple[int, ...]:
    from torch._dynamo.utils import counters

    return tuple(counters[group][name] for group, name in _CACHE_COUNTERS)


def _start_workers_ahead(_: Any) -> None:
    global _counts_at_start
    _counts_at_start = _cache_counts()
    if cutedsl_gemm_listed():
        workers.pool().start_zygote()


def _stop_unused_workers(_: Any) -> None:
    misses, *hits = (now - then for now, then in zip(_cache_counts(), _counts_at_start))
    workers.pool().stop_unused_zygote(warm=misses == 0 and sum(hits) > 0)
