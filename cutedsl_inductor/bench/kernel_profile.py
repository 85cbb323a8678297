"""Where a call's GPU time goes: the CUDA kernels a few calls run under torch.profiler
(CUDA activity only), each kernel's time and launches per call. ``bench model
--profile`` sorts them into categories; ``bench attention --profile`` lists them.

Memsets count where asked (a workspace zeroed by ``cudaMemsetAsync`` is part of the
call); copies never do. Kernels that overlap on several streams are counted in full. On
a machine without CUDA nothing runs under the profiler: no kernels.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class KernelTime:
    """One kernel's share of a call: its name, ms and launches per call."""
    name: str
    ms: float
    launches: float


def kernel_events(run: Callable[[], None], units: int, memsets: bool = False
                  ) -> list[tuple[str, float]]:
    """(name, µs) of every CUDA kernel (and memset, where ``memsets``) that ``units``
    calls of ``run`` launch, in the order they ran."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available():  # the profiler takes no CUDA activity there
        return []
    skipped = ("Memcpy",) if memsets else ("Memcpy", "Memset")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(units):
            run()
        torch.cuda.synchronize()
    return [(e.name, e.time_range.elapsed_us()) for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CUDA
            and not e.name.startswith(skipped)]


def per_call(events: list[tuple[str, float]], units: int) -> list[KernelTime]:
    """``events`` of ``units`` calls summed by kernel name, per call, the longest first."""
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for name, us in events:
        totals[name][0] += us
        totals[name][1] += 1
    kernels = [KernelTime(name, us / 1000 / units, count / units)
               for name, (us, count) in totals.items()]
    return sorted(kernels, key=lambda k: -k.ms)
