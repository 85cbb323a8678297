"""``bench model``'s workloads, and how one variant's unit of each is run, timed and checked.

Workloads: ``prefill`` (4 x 2048 tokens, no grad), ``decode`` (``model_decode.py``: a
static KV cache, a prompt, then generated tokens), ``small-m`` (64 sequences of one token,
no KV cache, no grad: every GEMM at M = 64) and ``train`` (2 x 2048 tokens, forward and
backward of ``logits.float().square().mean()``). An encoder's sequences are cut to its
length (``Family.fit``) and it runs ``prefill`` and ``train`` alone. ``decode`` and
``small-m`` run with and without CUDA graphs (``Shape.graphs``).

A runner is one variant on one shape: a timed unit is ``prepare()`` then ``per_unit`` calls
of ``run()`` (a step; for decode, a generation of N tokens), ``unit_ms`` its ms per step
between CUDA events (the wall clock on a CPU) and ``host_ms`` the host's ms per step in
8-step bursts timed without synchronizing, the GPU idle at each start: a burst stays
under the launch queue's depth, so a step whose host ms is near its ms is host-bound.
``check()`` is the relative error of its outputs to an fp32 copy's (``rel_error``: the
largest relative Frobenius error, inf where one is not finite, a near-zero reference
measured against a floor); for ``train`` the
outputs are the loss and every parameter's gradient, and a second step without zeroing
must double the gradients.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Sequence
from typing import Any, Protocol

STEPS = {"prefill": (4, 2048), "small-m": (64, 1), "train": (2, 2048)}
WORKLOADS = ("prefill", "decode", "small-m", "train")
GRAPHS = ("decode", "small-m")  # the workloads run under CUDA graphs too


@dataclasses.dataclass(frozen=True)
class Shape:
    batch: int
    seq: int  # tokens per sequence; decode: the prompt's (the context)
    graphs: bool = False


class Runner(Protocol):
    per_unit: int

    def prepare(self) -> None: ...

    def run(self) -> Any: ...

    def check(self) -> float: ...


def rel_error(outputs: Sequence[Any], refs: Sequence[Any]) -> float:
    """The largest relative (Frobenius) error over the outputs; inf if any is not finite.
    A reference whose norm is under a thousandth of the references' median norm (a
    gradient zero in exact arithmetic, such as an attention key's bias: softmax ignores a
    shift) is measured against that floor instead, so that rounding noise around zero
    does not read as an error."""
    norms = [float(ref.norm()) for ref in refs]
    floor = max(1e-3 * statistics.median(norms), 1e-30)
    errors = []
    for out, ref, norm in zip(outputs, refs, norms, strict=True):
        if not bool(out.isfinite().all()):
            return float("inf")
        errors.append(float((out - ref).norm()) / max(norm, floor))
    return max(errors)


def step(model: Any, ids: Any, train: bool) -> Any:
    """One step: the logits, or (train) the loss after its backward."""
    logits = model(input_ids=ids, use_cache=False).logits
    if not train:
        return logits
    loss = logits.float().square().mean()
    loss.backward()
    return loss


def outputs(model: Any, result: Any, train: bool) -> list[Any]:
    """What is checked: the logits, or the loss and every parameter's gradient (fp32)."""
    if not train:
        return [result.detach().float().clone()]
    return [result.detach().float().reshape(1), *gradients(model)]


def gradients(model: Any) -> list[Any]:
    return [p.grad.float().clone() for p in model.parameters() if p.grad is not None]


class Steps:
    """A forward or training step on fixed token ids, the same for every variant."""

    def __init__(self, workload: str, shape: Shape, vocab: int, device: str) -> None:
        import torch

        self.train = workload == "train"
        torch.manual_seed(1)
        self.ids = torch.randint(0, vocab, (shape.batch, shape.seq), device=device)
        self.refs: list[Any] = []

    def reference(self, fp32_model: Any) -> None:
        fp32_model.train(self.train)
        self.refs = outputs(fp32_model, step(fp32_model, self.ids, self.train), self.train)
        fp32_model.zero_grad(set_to_none=True)

    def target(self, model: Any) -> Any:
        """What a variant compiles: its model."""
        return model

    def start(self, model: Any) -> None:
        """Nothing is shared between the variants of a step workload."""

    def runner(self, model: Any, compiled: Any) -> StepRunner:
        model.train(self.train)
        return StepRunner(self, model, compiled)

    def close(self) -> None:
        self.refs = []


class StepRunner:
    per_unit = 1

    def __init__(self, steps: Steps, model: Any, compiled: Any) -> None:
        self.steps, self.model, self.compiled = steps, model, compiled

    def prepare(self) -> None:
        self.model.zero_grad(set_to_none=True)

    def run(self) -> Any:
        import torch

        # each step a new CUDA-graph generation: variants alternate in the rounds, and a
        # graph tree would otherwise take one variant's step for the next of another's
        torch.compiler.cudagraph_mark_step_begin()
        return step(self.compiled, self.steps.ids, self.steps.train)

    def check(self) -> float:
        train = self.steps.train
        self.prepare()
        first = outputs(self.model, self.run(), train)
        error = rel_error(first, self.steps.refs)
        if train:  # a second step adds its gradients to the first's
            self.run()
            error = max(error, rel_error(gradients(self.model), [2 * g for g in first[1:]]))
        return error


def synchronize(cuda: bool) -> None:
    if cuda:
        import torch

        torch.cuda.synchronize()


def unit_ms(runner: Runner, cuda: bool) -> float:
    """ms per step of one unit (its steps queued back to back)."""
    import torch

    runner.prepare()
    if not cuda:
        start = time.perf_counter()
        for _ in range(runner.per_unit):
            runner.run()
        return (time.perf_counter() - start) * 1e3 / runner.per_unit
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(runner.per_unit):
        runner.run()
    end.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(end) / runner.per_unit


def host_ms(runner: Runner, cuda: bool, burst: int = 8, rounds: int = 10) -> float:
    """Host ms per step: the median over ``rounds`` of ``burst`` steps (a unit's prepare
    where one starts) timed without synchronizing, the GPU idle at each start."""
    times = []
    for _ in range(rounds):
        synchronize(cuda)
        start = time.perf_counter()
        for index in range(burst):
            if index % runner.per_unit == 0:
                runner.prepare()
            runner.run()
        times.append((time.perf_counter() - start) / burst * 1e3)
    synchronize(cuda)
    return statistics.median(times)
