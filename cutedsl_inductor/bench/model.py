"""``python -m cutedsl_inductor bench model``: real models from transformers under
torch.compile, with and without our kernels, every variant measured in one run.

Families (random weights, bf16, sdpa attention, ``--layers`` decoder layers, default 2):
``llama`` (Llama-3-8B shapes: hidden 4096, MLP 14336 with SwiGLU, 32 heads, 8 KV heads,
vocab 128256) and ``gpt2`` (GPT-2 XL shapes: hidden 1600, Linear + bias + GELU MLPs of
6400, 25 heads, vocab 50257). Workloads: ``prefill`` (4 x 2048 tokens, no grad),
``decode`` (64 sequences of one token, no grad), ``decode-graphs`` (the same under CUDA
graphs: ``mode="max-autotune"``, ``"reduce-overhead"`` for Inductor's default) and
``train`` (2 x 2048 tokens, forward and backward of ``logits.float().square().mean()``).
Variants: ``eager``, ``default`` (torch.compile), ``max-autotune`` (ATEN,TRITON) and
``cutedsl`` (ATEN,TRITON,CUTEDSL; ``--fusion`` on and/or off, default: the package's
``config.epilogue_fusion``; ``--pdl`` on and/or off, default: ``config.gemm_pdl``);
``cutedsl-no-triton`` (ATEN,CUTEDSL, fusion and PDL as ``cutedsl``) runs only when named,
to tell what Triton's choices beside ours change.

Each measurement runs in a process of its own (``python -m cutedsl_inductor.bench.model
--child CASE``) with fresh Inductor and kernel caches: its first call is the cold figure;
a second process on the same caches gives the warm one (and must hit the FX graph cache,
compile no CuTe kernel and autotune nothing). ``cutedsl`` with fusion off shares the
caches of fusion on (its first call is not a cold figure), and so does each ``--pdl``
setting after the first. ms per step: the median of ``--steps`` CUDA-event-timed calls
after warm-ups; host ms per step (``host_ms``): of 8-step bursts timed without synchronizing,
so that a step near its ms is host-bound. Every output (logits; for ``train``
the loss and every parameter's gradient) is checked against an fp32 copy of the model:
its relative error must stay within twice that of eager bf16 (plus 1e-3), and finite;
for ``train`` a second step must also double the gradients (accumulation into them);
a step after the timed ones (under CUDA graphs, a replay) is checked the same way.
Each first call, cold and warm, is broken down (``first_call.py``: torch's compile and
its parts, ours, the rest; ``fc_*`` and ``warm_fc_*`` columns, a line under the row).
Prints the table, writes ``--out``/model_bench.csv and model_bench.png (speedups over
max-autotune first).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .. import config, counters
from ..autotune import retime
from . import first_call
from .args import one_of, output_folder, parse_count
from .model_profile import profile_steps, table
from .model_report import add_ratios, line, plot, summary, write_csv

FAMILIES = ("llama", "gpt2")
WORKLOADS = {"prefill": (4, 2048), "decode": (64, 1), "decode-graphs": (64, 1),
             "train": (2, 2048)}
VARIANTS = ("eager", "default", "max-autotune", "cutedsl", "cutedsl-no-triton")
DEFAULT_VARIANTS = VARIANTS[:4]
BACKENDS = {"max-autotune": "ATEN,TRITON", "cutedsl": "ATEN,TRITON,CUTEDSL",
            "cutedsl-no-triton": "ATEN,CUTEDSL"}


@dataclasses.dataclass(frozen=True)
class Case:
    family: str
    workload: str
    variant: str
    layers: int = 2
    batch: int = 0  # 0: the workload's default (WORKLOADS)
    seq: int = 0
    fusion: bool | None = None  # cutedsl only; None: config.epilogue_fusion as set
    pdl: bool | None = None  # cutedsl only; None: config.gemm_pdl as set
    gemm_backends: str = ""  # "": the variant's (BACKENDS)
    steps: int = 15
    warmup: int = 3
    profile: int = 0  # steps run under torch.profiler after the timed ones (model_profile)

    @property
    def tokens(self) -> tuple[int, int]:
        batch, seq = WORKLOADS[self.workload]
        return self.batch or batch, self.seq or seq


def build_model(family: str, layers: int) -> Any:
    """A ``family`` model of ``layers`` layers, random weights, bf16, on the GPU."""
    import torch
    import transformers

    if family == "llama":
        cfg = transformers.LlamaConfig(
            hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
            num_key_value_heads=8, num_hidden_layers=layers, vocab_size=128256,
            max_position_embeddings=8192, rope_theta=500000.0)
        cls = transformers.LlamaForCausalLM
    elif family == "gpt2":
        cfg = transformers.GPT2Config(
            n_embd=1600, n_inner=6400, n_head=25, n_layer=layers, vocab_size=50257,
            n_positions=2048, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        cls = transformers.GPT2LMHeadModel
    else:
        raise ValueError(f"unknown model family {family!r}; one of {FAMILIES}")
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device("cuda"):
        return cls(cfg).to(torch.bfloat16)


def _step(model: Any, ids: Any, train: bool) -> Any:
    """One step: the logits, or (train) the loss after its backward."""
    logits = model(input_ids=ids, use_cache=False).logits
    if not train:
        return logits
    loss = logits.float().square().mean()
    loss.backward()
    return loss


def _outputs(model: Any, result: Any, train: bool) -> list[Any]:
    """What is checked: the logits, or the loss and every parameter's gradient (fp32)."""
    if not train:
        return [result.detach().float().clone()]
    return [result.detach().float().reshape(1)] + [
        p.grad.float().clone() for p in model.parameters() if p.grad is not None]


def _rel_errors(outputs: list[Any], refs: list[Any]) -> float:
    """The largest relative (Frobenius) error over the outputs; inf if any is not finite."""
    errors = []
    for out, ref in zip(outputs, refs, strict=True):
        if not bool(out.isfinite().all()):
            return float("inf")
        errors.append(float((out - ref).norm() / ref.norm().clamp_min(1e-30)))
    return max(errors)


def _compiled(case: Case, model: Any) -> Any:
    """The model as the variant runs it."""
    import torch

    if case.variant == "eager":
        return model
    graphs = case.workload == "decode-graphs"
    if case.variant == "default":
        return torch.compile(model, mode="reduce-overhead" if graphs else None)
    torch._inductor.config.max_autotune_gemm_backends = (case.gemm_backends
                                                         or BACKENDS[case.variant])
    if case.fusion is not None:
        config.epilogue_fusion = case.fusion
    if case.pdl is not None:
        config.gemm_pdl = case.pdl
    return torch.compile(model, mode="max-autotune" if graphs else "max-autotune-no-cudagraphs")


def _output_code_kernels() -> int:
    """How many CuteDSL kernels the output code compiled in this process defines."""
    from torch._inductor.codecache import PyCodeCache

    names = set()
    for module in list(PyCodeCache.modules):
        path = getattr(module, "__file__", None)
        if path and os.path.exists(path):
            names |= set(re.findall(r"^(cutedsl_\w+) = load_kernel\(",
                                    Path(path).read_text(), re.M))
    return len(names)


def measure(case: Case) -> dict[str, Any]:
    """Run ``case`` in this process (see the module docstring); its row of figures."""
    import torch
    from torch._dynamo.utils import counters

    train = case.workload == "train"
    model = build_model(case.family, case.layers)
    model.train(train)
    batch, seq = case.tokens
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), device="cuda")
    reference = copy.deepcopy(model).float()
    with torch.set_grad_enabled(train):
        refs = _outputs(reference, _step(reference, ids, train), train)
        del reference
        eager_error = _rel_errors(_outputs(model, _step(model, ids, train), train), refs)
        model.zero_grad(set_to_none=True)
        runner = _compiled(case, model)
        recorder = first_call.Recorder()
        start = time.perf_counter()
        result = _step(runner, ids, train)
        torch.cuda.synchronize()
        first_call_s = time.perf_counter() - start
        breakdown = recorder.columns(first_call_s) if case.variant != "eager" else {}
        outputs = _outputs(model, result, train)
        error = _rel_errors(outputs, refs)
        if train:  # a second step adds its gradients to the first's
            _step(runner, ids, train)
            doubled = [2 * grad for grad in outputs[1:]]
            error = max(error, _rel_errors(_outputs(model, result, train)[1:], doubled))
        del result, outputs
        ms = _median_step_ms(lambda: _step(runner, ids, train), model, case)
        host_ms = _host_step_ms(lambda: _step(runner, ids, train), model)
        gpu = (profile_steps(lambda: _step(runner, ids, train),
                             lambda: model.zero_grad(set_to_none=True), case.profile, ms)
               if case.profile else {})
        # the last timed step (a CUDA graph's replay, where graphs are on) is checked too
        model.zero_grad(set_to_none=True)
        error = max(error, _rel_errors(_outputs(model, _step(runner, ids, train), train), refs))
    return {**dataclasses.asdict(case), "tokens": f"{batch}x{seq}", "ms": ms,
            "host_ms": host_ms,
            "first_call_s": first_call_s, "rel_err": error, "rel_err_eager": eager_error,
            "ok": error <= 2 * eager_error + 1e-3,
            "cute_compiled": counters.kernels.compiled,
            "cute_kernels": _output_code_kernels(),
            "fx_hits": counters["inductor"]["fxgraph_cache_hit"]
            + counters["aot_autograd"]["autograd_cache_hit"],
            "fx_misses": counters["inductor"]["fxgraph_cache_miss"],
            "fx_bypasses": counters["inductor"]["fxgraph_cache_bypass"]
            + counters["inductor"]["fxgraph_cache_pickle_error"],
            "retimed": len(retime._WINNERS),
            # a warm process's kernels load without CuTe DSL (``runtime/loader.py``)
            "cutlass_imported": "cutlass" in sys.modules, **breakdown, **gpu}


def _median_step_ms(step: Any, model: Any, case: Case) -> float:
    import torch

    times = []
    for index in range(case.warmup + case.steps):
        model.zero_grad(set_to_none=True)
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        step()
        end.record()
        torch.cuda.synchronize()
        if index >= case.warmup:
            times.append(begin.elapsed_time(end))
    return statistics.median(times)


def _host_step_ms(step: Any, model: Any, burst: int = 8, rounds: int = 10) -> float:
    """Host ms per step: the median over ``rounds`` of ``burst`` back-to-back steps timed
    without synchronizing, the GPU idle at each round's start. A burst stays under the
    launch queue's depth (about a thousand launches), so the host never waits for the GPU:
    a step whose host ms is near its ms is host-bound."""
    import torch

    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(burst):
            model.zero_grad(set_to_none=True)
            step()
        times.append((time.perf_counter() - start) / burst * 1e3)
    torch.cuda.synchronize()
    return statistics.median(times)


def run_child(case: Case, caches: Path, kernels: Path | None = None,
              timeout_s: float = 1800) -> dict[str, Any]:
    """``measure(case)`` in a fresh process whose Inductor caches are under ``caches``
    (its log too, in ``caches``/logs), its kernel cache in ``kernels`` (default:
    ``caches``/kernels); raises with the log's end if it fails."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor"),
           "CUTEDSL_INDUCTOR_CACHE_DIR": str(kernels or caches / "kernels"),
           "TORCHINDUCTOR_FX_GRAPH_CACHE": "1"}
    run = subprocess.run([sys.executable, "-m", "cutedsl_inductor.bench.model", "--child",
                          json.dumps(dataclasses.asdict(case))],
                         env=env, capture_output=True, text=True, timeout=timeout_s)
    logs = caches / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    fusion = {None: "", True: "-fusion", False: "-no-fusion"}[case.fusion]
    pdl = {None: "", True: "-pdl", False: "-no-pdl"}[case.pdl]
    log_name = f"{case.family}-{case.workload}-{case.variant}{fusion}{pdl}-{time.time_ns()}.log"
    (logs / log_name).write_text(run.stderr)
    if run.returncode != 0:
        raise RuntimeError(f"{case} failed (rc {run.returncode}):\n{run.stderr[-4000:]}")
    row = json.loads(run.stdout.strip().splitlines()[-1])
    # Inductor prints a table per autotuning it times (its counters cannot tell: an FX
    # graph cache hit adds the counts of the compile it replays)
    row["autotunings"] = len(re.findall(r"^AUTOTUNE ", run.stderr, re.M))
    return row


def cases_of(args: argparse.Namespace) -> list[tuple[Case, str]]:
    """Every (case, cache group) of a run: cases of one group share caches, the first
    of a group starts them cold (``cutedsl``'s other fusion and PDL settings join the first's
    group)."""
    batch, seq = args.tokens or (0, 0)
    cases = []
    for family in args.families:
        for workload in args.workloads:
            for variant in args.variants:
                ours = variant.startswith("cutedsl")
                for fusion in args.fusion if ours else [None]:
                    for pdl in args.pdl if ours else [None]:
                        case = Case(family, workload, variant, layers=args.layers,
                                    batch=batch, seq=seq, fusion=fusion, pdl=pdl,
                                    steps=args.steps, profile=args.profile)
                        cases.append((case, f"{family}-{workload}-{variant}"))
    return cases


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    root = Path(tempfile.mkdtemp(prefix="cutedsl-bench-model-"))
    started: set[str] = set()
    for case, group in cases_of(args):
        caches = root / group
        cold = group not in started
        started.add(group)
        row = run_child(case, caches)
        row["caches"] = "cold" if cold else "shared"
        if cold and case.variant != "eager" and args.warm:
            warm = run_child(case, caches)
            row.update(first_call_warm_s=warm["first_call_s"], warm_ok=warm["ok"],
                       warm_cute_compiled=warm["cute_compiled"], warm_fx_hits=warm["fx_hits"],
                       warm_fx_misses=warm["fx_misses"], warm_autotunings=warm["autotunings"],
                       warm_retimed=warm["retimed"],
                       warm_cutlass_imported=warm["cutlass_imported"],
                       **{f"warm_{k}": v for k, v in warm.items() if k.startswith("fc_")})
        rows.append(row)
        print(line(row), flush=True)
        for text in (first_call.describe(row), first_call.describe(row, warm=True)):
            if text:
                print(f"    first call {text}", flush=True)
        write_csv(rows, args.out / "model_bench.csv")
    add_ratios(rows)
    write_csv(rows, args.out / "model_bench.csv")
    return rows


def _parse_tokens(text: str) -> tuple[int, int]:
    batch, _, seq = text.partition("x")
    if not (batch.isdigit() and seq.isdigit() and int(batch) > 0 and int(seq) > 0):
        raise argparse.ArgumentTypeError(f"--tokens {text!r}: expected BATCHxSEQ, e.g. 4x2048")
    return int(batch), int(seq)


def _switches(option: str) -> Any:
    """The parser of ``option``'s values: on, off, default (the package's) or a list."""
    values = {"on": True, "off": False, "default": None}

    def parse(text: str) -> list[bool | None]:
        parts = text.split(",")
        if any(p not in values for p in parts):
            raise argparse.ArgumentTypeError(f"{option} {text!r}: on, off, default or a list")
        return [values[p] for p in parts]

    return parse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--families", type=one_of(FAMILIES, "family", all_of=True),
                   default=list(FAMILIES))
    p.add_argument("--workloads", type=one_of(tuple(WORKLOADS), "workload", all_of=True),
                   default=list(WORKLOADS))
    p.add_argument("--variants", type=one_of(VARIANTS, "variant", all_of=True),
                   default=list(DEFAULT_VARIANTS))
    p.add_argument("--fusion", type=_switches("--fusion"), default=[None],
                   help="cutedsl's epilogue fusion: on, off, default (the package's) or a list")
    p.add_argument("--pdl", type=_switches("--pdl"), default=[None],
                   help="cutedsl's GEMMs with programmatic dependent launch "
                        "(config.gemm_pdl): on, off, default or a list")
    p.add_argument("--layers", type=parse_count, default=2)
    p.add_argument("--tokens", type=_parse_tokens, default=None,
                   help="BATCHxSEQ for every workload (default: each workload's own)")
    p.add_argument("--steps", type=parse_count, default=15)
    p.add_argument("--profile", type=parse_count, default=0, metavar="N",
                   help="also run N steps under torch.profiler: GPU ms per step by kernel "
                   "category, and the time no kernel ran (default 0: off)")
    p.add_argument("--no-warm", dest="warm", action="store_false",
                   help="skip the warm second process of each variant")
    p.add_argument("--out", type=output_folder, default=Path("bench-out"))


def main(args: argparse.Namespace) -> int:
    import torch

    if not torch.cuda.is_available():
        print("bench model needs an sm_90 GPU")
        return 2
    if importlib.util.find_spec("transformers") is None:
        print("bench model needs transformers: pip install 'cutedsl-inductor[bench]'")
        return 2
    rows = run(args)
    print(summary(rows))
    print(table(rows))
    plot(rows, args.out / "model_bench.png")
    print(f"\nwrote {args.out / 'model_bench.csv'} and {args.out / 'model_bench.png'}")
    return 0 if all(r["ok"] and r.get("warm_ok", True) for r in rows) else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(measure(Case(**json.loads(sys.argv[2])))))
    else:
        sys.exit("usage: python -m cutedsl_inductor bench model ...")
