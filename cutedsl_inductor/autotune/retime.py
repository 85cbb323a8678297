"""Timing our closest choices again, in interleaved rounds, where Inductor's one pass
over a choice list picked among near-ties.

Inductor times each choice once (ours: the faster of two timings), one after another;
the GPU's clock drifts under the power cap meanwhile, so choices within 2-3% of each
other are ranked by when they ran as much as by their speed. On the H200, SwiGLU at
1024x128256x4096 took a 128x128 kernel that one pass timed 2% ahead of a 256x96 one,
which five interleaved rounds had 3-7% behind. ``fastest_in_rounds`` times a few
candidates in turn, ``RETIME_ROUNDS`` rounds (``timing.fastest_by_median``, as the
benchmarks do), the median round counting; a repeat of the same candidates at the same
sizes (a model's next layer) takes the first one's winner untimed, and so does a later
process, on this machine or another with the same GPU and software: each winner is kept
as a tuning decision (``compile/cache/decisions.py``: the local cache, the remote tier, cache
artifacts), keyed by the candidates' binaries, the sizes, the GPU and the torch, CUDA and
toolchain versions. A stored winner that is not among the candidates is not taken.

``recording_timings`` catches the timings an autotuning ends with, whether measured or
read from Inductor's autotune cache: it installs a feedback saver (Inductor's public
hook, called with every autotuning's timings) for the duration of a ``with`` block only.

Failure semantics: ``choice_calls`` and ``fastest_in_rounds`` raise what a candidate's
load or runs raise; callers keep Inductor's pick then.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterator
from typing import Any

from .. import config
from ..compile.cache import decisions
from ..compile.compiler import target_arch
from .timing import fastest_by_median

# Interleaved timing rounds of retimed candidates (their median counts).
RETIME_ROUNDS = 3
# The winners of this process's retimings, by (the candidates' binaries, the sizes they
# ran at). A model's layers repeat a node: each repeat takes the first one's winner
# untimed, as Inductor's own autotuning is cached within a process, and the repeats
# share one kernel. A name among the candidates is all it ever returns.
_WINNERS: dict[tuple, str] = {}


class TimingsRecord:
    """An Inductor feedback saver: the timings of the autotunings run while installed."""

    def __init__(self) -> None:
        self.timings: dict[Any, float] = {}

    def __call__(self, timings: dict[Any, float], *_context: Any) -> None:
        self.timings.update(timings)


@contextlib.contextmanager
def recording_timings() -> Iterator[TimingsRecord]:
    """A ``TimingsRecord`` installed as a feedback saver for the ``with`` block."""
    from torch._inductor import select_algorithm

    cache = select_algorithm.get_algorithm_selector_cache()
    record = TimingsRecord()
    cache.add_feedback_saver(record)
    try:
        yield record
    finally:
        cache.feedback_saver_fns.remove(record)


def fastest_in_rounds(calls: dict[str, Callable[[], Any]],
                      sizes: Hashable) -> tuple[str, dict[str, float]]:
    """The name of the fastest of ``calls`` (each named by the binary it runs) by median
    round, and each one's median (ms); the medians are empty where an earlier retiming of
    the same binaries at the same ``sizes`` decided (in this process: ``_WINNERS``; in
    another: a stored decision)."""
    key = (tuple(sorted(calls)), sizes)
    if key not in _WINNERS:
        stored_as = winner_key(key)
        stored = decisions.lookup(stored_as)
        if not (isinstance(stored, dict) and stored.get("winner") in calls):
            _WINNERS[key], medians = fastest_by_median(calls, RETIME_ROUNDS)
            decisions.save(stored_as, {"winner": _WINNERS[key]})
            return _WINNERS[key], medians
        _WINNERS[key] = stored["winner"]
    return _WINNERS[key], {}


def winner_key(key: tuple) -> str:
    """The decision key of a retiming: its candidates and sizes on this GPU, with this
    torch and CUDA, for the target arch and compile options (the candidates' names may not
    say them; ``decision_key`` adds the toolchain versions)."""
    import torch

    device = torch.cuda.get_device_properties()  # the current device's
    return decisions.decision_key("retime", {
        "candidates": key[0], "sizes": key[1], "arch": target_arch(),
        "options": config.compile_options, "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": [device.name, device.major, device.minor, device.multi_processor_count]})


def choice_calls(choices: list[Any]) -> tuple[dict[str, Callable[[], Any]], Hashable]:
    """Calls of ``choices`` (CuteDSL choices of one node), each named by its binary
    (``hash_key``) and run once (a failing kernel raises here), on random tensors made
    from their requests' argument metas (``example_tensor``: shared, so each operand is
    allocated once); and the sizes they run at."""
    tensors: dict[tuple, Any] = {}
    calls = {}
    for choice in choices:
        request = choice.bmreq
        call = request.make_run_fn(
            *(example_tensor(meta, tensors) for meta in request.input_tensor_meta),
            out=example_tensor(request.output_tensor_meta, tensors))
        call()
        calls[choice.hash_key()] = call
    return calls, tuple(sorted(str(key[1:]) for key in tensors))  # not the buffers' names


def example_tensor(meta: Any, tensors: dict[tuple, Any]) -> Any:
    """A random tensor for an argument's ``TensorMeta``: the one in ``tensors`` made for
    the same buffer, sizes, strides, dtype and device, else a new one (added there)."""
    key = (meta.name, tuple(meta.sizes), tuple(meta.strides), meta.dtype, meta.device)
    if key not in tensors:
        tensors[key] = meta.to_tensor()
    return tensors[key]
