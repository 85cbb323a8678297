"""``bench model --profile N``: where a step's GPU time goes. N units (steps; for decode,
generations) run under torch.profiler (CUDA activity only) after the timed ones; every
kernel is put in one category by its name, and the row gets each category's kernel time
per step, the kernels' total, and the step's time the GPU ran no kernel (``idle``: the
timed median minus the kernels' total; launch gaps and host waits). The ten kernels with the most
time per step go to the child's log.

Categories: ``cutedsl`` (CuTe DSL kernels, ours or a template author's: the DSL names
every kernel ``kernel_cutlass_...``), ``triton_gemm`` (Inductor's Triton GEMM
templates), ``triton`` (Inductor's other Triton kernels: pointwise, reductions),
``aten_gemm`` (cuBLAS / cuBLASLt / CUTLASS inside ATen), ``attention`` (SDPA's flash,
memory-efficient and cuDNN kernels) and ``other`` (ATen's elementwise kernels, copies,
fills). Kernels that overlap on several streams are counted in full, so ``idle`` can
read below zero there.
"""

from __future__ import annotations

import logging
from typing import Any

from .kernel_profile import KernelTime, kernel_events, per_call
from .model_report import label
from .model_workloads import Runner

log = logging.getLogger(__name__)

CATEGORIES = ("cutedsl", "triton_gemm", "triton", "aten_gemm", "attention", "other")
_ATTENTION = ("flash", "fmha", "attention", "attn", "cudnn")
_ATEN_GEMM = ("gemm", "nvjet", "xmma", "cublas", "cutlass", "splitkreduce")


def category(kernel: str) -> str:
    """The category of a CUDA kernel by its (possibly demangled C++) name."""
    name = kernel.lower()
    if name.startswith("kernel_cutlass_"):
        return "cutedsl"
    if name.startswith("triton_tem_") or name.startswith("triton_mm"):
        return "triton_gemm"
    if name.startswith("triton"):
        return "triton"
    if any(word in name for word in _ATTENTION):
        return "attention"
    if any(word in name for word in _ATEN_GEMM):
        return "aten_gemm"
    return "other"


def gpu_breakdown(kernels: list[tuple[str, float]], steps: int, step_ms: float
                  ) -> tuple[dict[str, Any], list[KernelTime]]:
    """The row's figures from ``(kernel name, µs)`` of ``steps`` profiled steps, and the
    top ten kernels, per step."""
    per_category = dict.fromkeys(CATEGORIES, 0.0)
    for name, us in kernels:
        per_category[category(name)] += us / 1000 / steps
    total = sum(per_category.values())
    row: dict[str, Any] = {f"gpu_{c}_ms": ms for c, ms in per_category.items()}
    row.update(gpu_kernels_ms=total, gpu_idle_ms=step_ms - total,
               gpu_launches=len(kernels) / steps)
    return row, per_call(kernels, steps)[:10]


def profile_units(runner: Runner, units: int, step_ms: float) -> dict[str, Any]:
    """Run ``units`` of ``runner``'s units under torch.profiler; their GPU breakdown per
    step."""
    def unit() -> None:
        runner.prepare()
        for _ in range(runner.per_unit):
            runner.run()

    kernels = kernel_events(unit, units)
    row, top = gpu_breakdown(kernels, units * runner.per_unit, step_ms)
    for kernel in top:
        log.warning("profile: %8.4f ms/step %5.1f launches/step %s", kernel.ms,
                    kernel.launches, kernel.name[:160])
    return row


def table(rows: list[dict[str, Any]]) -> str:
    """GPU ms per step by category, one line per profiled row."""
    shown = [r for r in rows if "gpu_kernels_ms" in r]
    if not shown:
        return ""
    head = ["", "GPU time per step (ms) by kernel category, under torch.profiler:",
            f"  {'row':40} " + " ".join(f"{c:>11}" for c in CATEGORIES)
            + f" {'kernels':>8} {'idle':>7} {'launches':>8}"]
    for r in shown:
        head.append(f"  {label(r):40} " + " ".join(f"{r[f'gpu_{c}_ms']:11.3f}" for c in CATEGORIES)
                    + f" {r['gpu_kernels_ms']:8.3f} {r['gpu_idle_ms']:7.3f}"
                    f" {r['gpu_launches']:8.0f}")
    return "\n".join(head)
