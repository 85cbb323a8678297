"""``bench model``'s measurements, each run in a process of its own (``model.py`` starts
them).

A ``Job`` is one family's workload on its shapes, every variant in one process. The fp32
copy's outputs come first, for every shape (then the copy is freed); each compiled
variant gets its own copy of the bf16 model. Per shape, after ``torch._dynamo.reset()``
(a shape compiles anew, as a fresh process would: Dynamo's local profile-guided
``automatic_dynamic`` is off, so no shape seen before makes a dimension dynamic), each
variant in turn: its runner compiled (``Variant.patched`` around its ``warmup`` units:
the first compiles, under CUDA graphs the next ones record), checked, its output code
checked (``OutputCode``). Then ``rounds`` interleaved rounds (``interleaved_ms``): each
variant in turn runs ``steps`` units, whose median ms per step is its figure of the
round. A variant's ms is the median of its rounds; its speedup over max-autotune (and
over eager) is the median of the per-round ratios, with their range
(``timing.round_speedup``). Then the host's ms per step, the ``--profile`` breakdown, and
a last check (under CUDA graphs, of replays). A frame that would pass Dynamo's recompile
limit raises instead of running eagerly; ``graph_skips`` counts the graphs Inductor ran
without CUDA graphs where they were asked for.

A ``FirstCall`` is one variant's first unit in a fresh process: its seconds and their
breakdown (``first_call.py``), the check after it, and what the process's caches did.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any

from .. import counters as package_counters  # torch's dynamo counters are `counters` here
from ..autotune import retime
from ..autotune.timing import interleaved_ms
from . import first_call
from .model_decode import Decode
from .model_families import FAMILIES
from .model_profile import profile_units
from .model_variants import OutputCode, Variant
from .model_workloads import Shape, Steps, host_ms, synchronize, unit_ms
from .timing import round_speedup

REFERENCES = ("max-autotune", "eager")  # the variants every other one's speedup is over


@dataclasses.dataclass(frozen=True)
class Job:
    family: str
    workload: str
    shapes: tuple[Shape, ...]
    variants: tuple[Variant, ...]
    layers: int = 8
    new_tokens: int = 32  # decode: tokens generated per unit
    steps: int = 5  # units per variant per round
    rounds: int = 7
    warmup: int = 3  # units per variant before the rounds
    profile: int = 0  # units under torch.profiler after the rounds

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Job:
        fields = json.loads(text)
        return cls(**{**fields, "shapes": tuple(Shape(**s) for s in fields["shapes"]),
                      "variants": tuple(Variant(**v) for v in fields["variants"])})


@dataclasses.dataclass(frozen=True)
class FirstCall:
    family: str
    workload: str
    shape: Shape
    variant: Variant
    layers: int = 8
    new_tokens: int = 32

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> FirstCall:
        fields = json.loads(text)
        return cls(**{**fields, "shape": Shape(**fields["shape"]),
                      "variant": Variant(**fields["variant"])})


def tokens(workload: str, shape: Shape, new_tokens: int) -> str:
    """``"4x2048"``; decode: ``"8x1024+32"`` (batch x context + generated)."""
    extra = f"+{new_tokens}" if workload == "decode" else ""
    return f"{shape.batch}x{shape.seq}{extra}"


def _bench(workload: str, shape: Shape, vocab: int, new_tokens: int, device: str) -> Any:
    if workload == "decode":
        return Decode(shape, vocab, new_tokens, device)
    return Steps(workload, shape, vocab, device)


def measure_job(job: Job, device: str = "cuda") -> Iterator[dict[str, Any]]:
    """Every variant on every shape of ``job`` (see the module docstring): the rows, a
    shape's as it is measured."""
    yield from measure_model(job, FAMILIES[job.family].build(job.layers, device), device)


def measure_model(job: Job, base: Any, device: str) -> Iterator[dict[str, Any]]:
    """``measure_job`` on ``base``, a model of ``job``'s family (a test's may be tiny)."""
    import torch

    benches = [_bench(job.workload, shape, base.config.vocab_size, job.new_tokens, device)
               for shape in job.shapes]
    with torch.set_grad_enabled(job.workload == "train"):
        reference = copy.deepcopy(base).float()
        for bench in benches:
            bench.reference(reference)
        del reference
        models = {variant: base if variant.name == "eager" else copy.deepcopy(base)
                  for variant in job.variants}
        with torch._dynamo.config.patch(automatic_dynamic_local_pgo=False,
                                        fail_on_recompile_limit_hit=True):
            for shape, bench in zip(job.shapes, benches, strict=True):
                yield from _measure_shape(job, shape, bench, base, models, device)
                bench.close()


def _measure_shape(job: Job, shape: Shape, bench: Any, base: Any, models: dict[Variant, Any],
                   device: str) -> list[dict[str, Any]]:
    import torch
    from torch._dynamo.utils import counters

    cuda = device == "cuda"
    torch._dynamo.reset()
    bench.start(base)
    eager_error = bench.runner(base, bench.target(base)).check()
    runners, figures = {}, {}
    for variant, model in models.items():
        skips = counters["inductor"]["cudagraph_skips"]
        with variant.patched(shape.graphs), OutputCode() as code:
            runner = bench.runner(model, variant.compile(bench.target(model), shape.graphs))
            for _ in range(job.warmup):
                unit_ms(runner, cuda)
            error = runner.check()
        runners[variant] = runner
        figures[variant] = dict(
            rel_err=error, cute_kernels=code.check(variant) if variant.name != "eager" else 0,
            graph_skips=counters["inductor"]["cudagraph_skips"] - skips)
    times = interleaved_ms(runners, job.rounds, measure=lambda runner: statistics.median(
        unit_ms(runner, cuda) for _ in range(job.steps)))
    references = {variant.name: times[variant] for variant in runners
                  if variant.name in REFERENCES}
    rows = []
    for variant, runner in runners.items():
        ms = statistics.median(times[variant])
        sequences = shape.batch if job.workload == "decode" else shape.batch * shape.seq
        error = max(figures[variant].pop("rel_err"), runner.check())
        row = dict(family=job.family, workload=job.workload,
                   tokens=tokens(job.workload, shape, job.new_tokens), batch=shape.batch,
                   seq=shape.seq, graphs=shape.graphs, layers=job.layers, **variant.columns(),
                   ms=ms, ms_min=min(times[variant]),
                   ms_max=max(times[variant]), tokens_per_s=sequences * 1e3 / ms,
                   host_ms=host_ms(runner, cuda), rel_err=error, rel_err_eager=eager_error,
                   ok=error <= 2 * eager_error + 1e-3, rounds=job.rounds, steps=job.steps,
                   **figures[variant])
        for name, ref_ms in references.items():
            if name != variant.name:
                speedup, low, high = round_speedup(ref_ms, times[variant])
                row.update({f"speedup_vs_{name}": speedup, f"speedup_vs_{name}_min": low,
                            f"speedup_vs_{name}_max": high})
        if job.profile and cuda:
            row.update(profile_units(runner, job.profile, ms))
        rows.append(row)
    return rows


def measure_first_call(case: FirstCall, device: str = "cuda") -> dict[str, Any]:
    """``case``'s first unit in this process: its row of figures."""
    return first_call_of(case, FAMILIES[case.family].build(case.layers, device), device)


def first_call_of(case: FirstCall, model: Any, device: str) -> dict[str, Any]:
    """``measure_first_call`` on ``model``, a model of ``case``'s family."""
    import torch
    from torch._dynamo.utils import counters

    bench = _bench(case.workload, case.shape, model.config.vocab_size, case.new_tokens, device)
    variant, graphs = case.variant, case.shape.graphs
    with torch.set_grad_enabled(case.workload == "train"):
        reference = copy.deepcopy(model).float()
        bench.reference(reference)
        del reference
        bench.start(model)
        eager_error = bench.runner(model, bench.target(model)).check()
        with variant.patched(graphs), OutputCode() as code:
            runner = bench.runner(model, variant.compile(bench.target(model), graphs))
            recorder = first_call.Recorder()
            start = time.perf_counter()
            runner.prepare()
            runner.run()
            synchronize(device == "cuda")
            first_call_s = time.perf_counter() - start
            breakdown = recorder.columns(first_call_s)
            error = runner.check()
        kernels = code.check(variant)
    return {"first_call_s": first_call_s, "first_call_ok": error <= 2 * eager_error + 1e-3,
            "first_call_rel_err": error, "cute_compiled": package_counters.kernels.compiled,
            "first_call_cute_kernels": kernels,
            "fx_hits": counters["inductor"]["fxgraph_cache_hit"]
            + counters["aot_autograd"]["autograd_cache_hit"],
            "fx_misses": counters["inductor"]["fxgraph_cache_miss"],
            "fx_bypasses": counters["inductor"]["fxgraph_cache_bypass"]
            + counters["inductor"]["fxgraph_cache_pickle_error"],
            "retimed": len(retime._WINNERS),
            # a warm process's kernels load without CuTe DSL (``runtime/loader.py``)
            "cutlass_imported": "cutlass" in sys.modules, **breakdown}
