"""CuteDSLBenchmarkRequest: a CuteDSL choice as Inductor's picklable ``bmreq``, so that
``TORCHINDUCTOR_AUTOTUNE_IN_SUBPROC=1`` (and pipelined autotuning) times our kernels in
a tuning subprocess, where a kernel that faults (a sticky CUDA error) takes down only
that process and the choice times as ``inf``, not the user's.

The request carries what rebuilds the kernel there: the kernel (``KernelSource``: the
rendered source, argument specs, template name and parameters), and the knobs that decide where its binary is cached and
what it is compiled for. In the subprocess ``make_run_fn`` loads the kernel (a disk
cache hit when the parent precompiled it; otherwise it compiles) and launches it on
tensors that Inductor makes from ``input_tensor_meta``: one per entry argument, with the
argument's own sizes and strides (a transposed operand, an expanded bias), so they are
passed to the kernel as they are.

Each choice is timed ``TIMINGS`` times, the fastest counting (``fastest_ms``, here and
in process, ``CuteDSLTemplateCaller.benchmark``): a slowdown that lasts one whole timing
(Inductor's ``benchmark_gpu``, itself the fastest of its calls; its cause was not found)
only ever adds time, so the other timing stands. The choice marked to settle the clocks
(``settle_ms``, see ``autotune/select.py``) first runs that long untimed.

Invariants: holds no tensor and nothing of CUDA (it crosses process boundaries); runs
the same binary as the in-process path (same source, specs and compile key); a choice's
workspace is made and zeroed here as the output code does (``workspace_call``).

Failure semantics: a choice that fails there (to build, load or run) is logged in that
process, naming the template, its parameters and the error (Inductor's own warning names
only the choice), and the error goes back to Inductor, which times the choice as ``inf``.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any, Callable

import torch
from torch._inductor.autotune_process import (
    BenchmarkRequest,
    GPUDeviceBenchmarkMixin,
    TensorMeta,
)

from .. import config
from ..compile.compiler import target_arch
from ..compile.records import KernelSource
from ..compile.specs import Workspace
from ..runtime.loader import load

log = logging.getLogger(__name__)

# One timing can read twice a kernel's time and drop a winner from the fused candidates
# (the case is in docs/measurements.md); a second one rarely does too.
TIMINGS = 2
# Calls between two synchronizes while settling the clocks: the host stays at most this
# many launches ahead of the GPU.
_CALLS_PER_SYNC = 8


def argument_meta(node: Any, size: tuple[int, ...], stride: tuple[int, ...]) -> TensorMeta:
    """The meta of an entry argument that reads ``node`` with ``size`` and ``stride``."""
    return TensorMeta(device=node.get_device(), dtype=node.get_dtype(), sizes=size,
                      strides=stride, offset=0, name=node.get_name())


def fastest_ms(timing: Callable[[], float], call: Callable[[], Any], settle_ms: float,
               device: torch.device) -> float:
    """The fastest of ``TIMINGS`` readings of ``timing()``; with ``settle_ms`` > 0, after
    ``call`` (what is timed, on ``device``) has run back to back, untimed, for that many
    milliseconds."""
    deadline = time.perf_counter() + settle_ms / 1e3
    while time.perf_counter() < deadline:
        for _ in range(_CALLS_PER_SYNC):
            call()
        torch.cuda.synchronize(device)  # that of the call, which need not be the current
    return min(timing() for _ in range(TIMINGS))


def workspace_call(wrapper: Any, workspace: Workspace | None, tensors: tuple[torch.Tensor, ...],
                   extra_args: list[int], stream: int) -> Callable[[], Any]:
    """A call of ``wrapper`` on ``tensors`` (the inputs, then the output) and
    ``extra_args``; a choice's workspace is made once and zeroed before every call where
    asked, as the output code zeroes it, so the timing counts that too."""
    if workspace is None:
        return functools.partial(wrapper.run, *tensors, *extra_args, stream=stream)
    scratch = workspace.make(tensors[-1].device)

    def call() -> Any:
        if workspace.zeroed:
            scratch.zero_()
        return wrapper.run(*tensors, scratch, *extra_args, stream=stream)

    return call


class CuteDSLBenchmarkRequest(GPUDeviceBenchmarkMixin, BenchmarkRequest):
    def __init__(
        self,
        kernel_name: str,
        input_tensor_meta: list[TensorMeta],
        output_tensor_meta: TensorMeta,
        extra_args: list[int],
        *,
        kernel: KernelSource,
        workspace: Workspace | None = None,
    ) -> None:
        super().__init__(kernel_name, input_tensor_meta, output_tensor_meta, extra_args)
        self.workspace = workspace
        self.kernel = kernel
        self.knobs = config.binary_knobs()
        self.knobs["arch"] = target_arch()  # as resolved here (another process may see no GPU)
        self.settle_ms = 0  # set on the first choice timed (autotune/select.py)

    def load(self) -> Any:
        """The kernel's wrapper, built as the requesting process would build it."""
        with config.patch(**self.knobs):
            return load(self.kernel)

    def benchmark(self, *input_tensors: torch.Tensor, out: torch.Tensor | None = None) -> float:
        try:
            return super().benchmark(*input_tensors, out=out)
        except Exception as err:
            log.warning("CuteDSL choice %s (template %r, parameters [%s]) failed in the tuning "
                        "subprocess: %s: %s", self.kernel_name, self.kernel.template,
                        self.kernel.params, type(err).__name__, err)
            raise

    def make_run_fn(self, *input_tensors: torch.Tensor, out: torch.Tensor
                    ) -> Callable[[], Any]:
        wrapper = self.load()
        stream = torch.cuda.current_stream(out.device).cuda_stream
        return workspace_call(wrapper, self.workspace, (*input_tensors, out), self.extra_args,
                              stream)

    def do_bench(self, fn: Callable[[], Any], *input_tensors: torch.Tensor,
                 out: torch.Tensor | None = None) -> float:
        # Inductor's BenchmarkRequest.benchmark passes ``out`` positionally, after the inputs
        device = (out if out is not None else input_tensors[-1]).device
        timing = super().do_bench  # bound here: a lambda has no zero-argument super()
        return fastest_ms(lambda: timing(fn, *input_tensors, out=out), fn, self.settle_ms,
                          device)

    def __str__(self) -> str:
        return f"CuteDSLBenchmarkRequest({self.kernel_name})"
