"""Choice selection: ``autotune_select_algorithm`` that returns the chosen IR node on
every supported torch (2.11 returns the node; 2.13 returns ``(node, choice)``), so a
lowering written once works on both; and settling the GPU's clock before an autotuning
that has our choices times its first choice.

Inductor times a choice list in order, right after compiling it, with the GPU idle
meanwhile; an idle GPU boosts its clock, and under the power cap the clock falls back
only after 0.1-0.2 s of load. On the H200, after 3 s idle, successive ``benchmark_gpu``
timings of one cuBLAS GEMM (8192x4096x14336 bf16) read 826, 769-814, 724-755, then
about 730 TFLOP/s: the first choice of a list (ATen's, in Inductor's GEMM lowerings)
timed up to 13% faster than it runs. ``settle_clocks_first`` (installed as
one of Inductor's autotuning preprocessing functions) moves our first choice to the
front of any list that has one and marks it: its benchmark first runs it untimed for
``config.autotune_settle_ms`` (``benchmark_request.fastest_ms``), then every choice is
timed at the clock it will run at. A list without our choices is left as it is.
"""

from __future__ import annotations

from typing import Any

from torch._inductor import select_algorithm

from .. import config
from .benchmark_request import CuteDSLBenchmarkRequest


def autotune_select_algorithm(name: str, choices: list[Any], input_nodes: list[Any],
                              layout: Any, **kwargs: Any) -> Any:
    """Inductor's ``autotune_select_algorithm``; with no choice left, its
    ``NoValidChoicesError`` says so (Inductor's own has no message)."""
    if not choices:
        raise select_algorithm.NoValidChoicesError(
            f"no choice to select from for {name!r}: every CuteDSL choice was dropped (the "
            "'dropping CuteDSL choice' warnings say why); give the lowering a fallback "
            "choice, e.g. an ATen ExternKernelChoice, for inputs its templates cannot take")
    selected = select_algorithm.autotune_select_algorithm(name, choices, input_nodes, layout,
                                                          **kwargs)
    return selected[0] if isinstance(selected, tuple) else selected


def settle_clocks_first(choices: list[Any]) -> list[Any]:
    """``choices`` with our first choice moved to the front and marked to settle the
    clock before its timing (unchanged without one, or with the knob at 0). Ours are
    the choices whose benchmark request is a ``CuteDSLBenchmarkRequest``."""
    ours = [c for c in choices if isinstance(getattr(c, "bmreq", None), CuteDSLBenchmarkRequest)]
    if not ours or config.autotune_settle_ms <= 0:
        return choices
    ours[0].bmreq.settle_ms = config.autotune_settle_ms
    return [ours[0], *(c for c in choices if c is not ours[0])]


def install_clock_settling() -> None:
    """Add ``settle_clocks_first`` to Inductor's autotuning preprocessing (idempotent)."""
    cache = select_algorithm.get_algorithm_selector_cache()
    if settle_clocks_first not in cache.preprocessing_fns:
        select_algorithm.add_preprocessing_fn(settle_clocks_first)
