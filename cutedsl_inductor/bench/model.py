"""``python -m cutedsl_inductor bench model``: real models from transformers under
torch.compile, with and without our kernels, timed in interleaved rounds in one process.

Families (``model_families.py``, random weights, bf16, ``--layers`` layers, default 8:
the LM head is then a small part of the model): ``llama``, ``mistral``, ``phi3``, ``gpt2``
and the encoder ``bert``. Workloads (``model_workloads.py``): ``prefill``, ``decode``
(``model_decode.py``: a static KV cache, contexts ``--contexts`` x batches ``--batches``,
``--new-tokens`` generated per unit), ``small-m`` (64 sequences of one token, no cache) and
``train``; ``decode`` and ``small-m`` with and without CUDA graphs (``--graphs``).
Variants (``model_variants.py``): ``eager``, ``default``, ``max-autotune`` (ATEN,TRITON),
``cutedsl`` (ATEN,TRITON,CUTEDSL; its levers ``--fusion``, ``--pdl``, ``--prologue`` and
``--sdpa`` on and/or off, default the package's, or ``--levers``: the package's settings
and each lever flipped alone) and ``cutedsl-no-triton`` (ATEN,CUTEDSL).

Per family and workload, one process (``model_measure.Job``) compiles every variant, each
under its own Inductor options, and times them in interleaved rounds; each of our
variants' speedup over max-autotune is the median of the per-round ratios, with their
range. That process runs on the caches of the environment (Inductor's and ours as
configured: a second run finds them warm). Before it, unless ``--no-first-calls``, each
compiled variant's first call runs in a fresh process with fresh caches (the cold figure,
broken down by ``first_call.py``), and a second process on the same caches gives the warm
one (``--no-warm`` skips it): on the workload's first shape, their figures join that
shape's rows, with each cold and warm first call over max-autotune's. ``cutedsl``'s later
lever settings share the first one's caches (their first calls are not cold). Every
output is checked against an fp32 copy of the model: the relative error must stay within
twice eager bf16's, plus 1e-3.

Prints a line per row as each process ends and the table of speedups at the end; writes
``--out``/model_bench_<gpu>.csv (after each process) and .png (``model_report.py``), and
each process's log to ``--out``/logs.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .. import config
from .args import one_of, output_folder, parse_count, parse_rounds
from .first_call import describe
from .model_families import FAMILIES
from .model_measure import FirstCall, Job, measure_first_call, measure_job
from .model_profile import table as profile_table
from .model_report import add_first_call_ratios, file_stem, line, plot, summary, write_csv
from .model_variants import LEVERS, NAMES, Variant
from .model_workloads import GRAPHS, STEPS, WORKLOADS, Shape

DEFAULT_VARIANTS = ("eager", "max-autotune", "cutedsl")
CONTEXTS, BATCHES = (1024, 4096), (1, 8, 64)
QUICK = {"contexts": (1024,), "batches": (8,), "rounds": 5, "steps": 3}
ROW = "ROW "  # a child's stdout line that carries a row


def variants_of(args: argparse.Namespace) -> tuple[Variant, ...]:
    """The variants named, ours once per combination of the lever settings given or, with
    ``--levers``, at the package's settings and then once per lever flipped alone."""
    if args.levers:
        flipped = [{lever: not getattr(config, knob)} for lever, knob in LEVERS.items()]
        ours = [{}, *flipped]
    else:
        ours = [dict(zip(LEVERS, values))
                for values in itertools.product(*(getattr(args, lever) for lever in LEVERS))]
    return tuple(Variant(name, **settings) for name in args.variants
                 for settings in (ours if name.startswith("cutedsl") else [{}]))


def shapes_of(workload: str, family: str, args: argparse.Namespace) -> tuple[Shape, ...]:
    graphs = args.graphs if workload in GRAPHS else [False]
    if workload == "decode":
        return tuple(Shape(batch, context, on) for context in args.contexts
                     for batch in args.batches for on in graphs)
    batch, seq = FAMILIES[family].fit(*(args.tokens or STEPS[workload]))
    return tuple(Shape(batch, seq, on) for on in graphs)


def jobs_of(args: argparse.Namespace) -> list[Job]:
    """A job per family and workload it runs (an encoder: prefill and train)."""
    return [Job(family, workload, shapes_of(workload, family, args), variants_of(args),
                layers=args.layers, new_tokens=args.new_tokens, steps=args.steps,
                rounds=args.rounds, warmup=args.warmup, profile=args.profile)
            for family in args.families for workload in args.workloads
            if FAMILIES[family].decoder or workload in ("prefill", "train")]


def first_calls_of(job: Job) -> list[tuple[FirstCall, str]]:
    """Each compiled variant's first call on the job's first shape, with its cache group:
    the first case of a group starts its caches cold."""
    return [(FirstCall(job.family, job.workload, job.shapes[0], variant, job.layers,
                       job.new_tokens), f"{job.family}-{job.workload}-{variant.name}")
            for variant in job.variants if variant.name != "eager"]


def run_child(kind: str, payload: str, logs: Path, caches: Path | None = None,
              kernels: Path | None = None, timeout_s: float = 3600
              ) -> tuple[list[dict[str, Any]], str]:
    """A measurement in a fresh process (``kind``: ``--job`` or ``--first-call``), its log
    in ``logs``; with ``caches``, Inductor's and our caches there (fresh where new; our
    kernels in ``kernels`` where given). Its rows and, where it failed, why (else "")."""
    env = dict(os.environ)
    if caches is not None:
        env.update(TORCHINDUCTOR_CACHE_DIR=str(caches / "inductor"),
                   CUTEDSL_INDUCTOR_CACHE_DIR=str(kernels or caches / "kernels"),
                   TORCHINDUCTOR_FX_GRAPH_CACHE="1")
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{kind.strip('-')}-{time.time_ns()}.log"
    with open(log, "w") as err:
        err.write(payload + "\n")
        err.flush()
        try:
            run = subprocess.run([sys.executable, "-m", "cutedsl_inductor.bench.model", kind,
                                  payload], env=env, stdout=subprocess.PIPE, stderr=err,
                                 text=True, timeout=timeout_s)
            stdout, failed = run.stdout, run.returncode != 0 and f"rc {run.returncode}"
        except subprocess.TimeoutExpired as expired:
            stdout, failed = expired.stdout or "", f"over {timeout_s:.0f} s"
    text = log.read_text()
    rows = [json.loads(out[len(ROW):]) for out in stdout.splitlines() if out.startswith(ROW)]
    if kind == "--first-call":  # Inductor prints a table per autotuning it times
        for row in rows:
            row["autotunings"] = len(re.findall(r"^AUTOTUNE ", text, re.M))
    return rows, f"{failed}, log {log}:\n{text[-3000:]}" if failed else ""


def _first_call_figures(job: Job, args: argparse.Namespace, root: Path, logs: Path
                        ) -> tuple[dict[Variant, dict[str, Any]], list[str]]:
    figures, failures, started = {}, [], set()
    for case, group in first_calls_of(job):
        cold = group not in started
        started.add(group)
        rows, failed = run_child("--first-call", case.to_json(), logs, root / group)
        if failed:
            failures.append(f"{job.family} {job.workload} {case.variant.label} first call "
                            f"{failed}")
            continue
        first = rows[0] | {"caches": "cold" if cold else "shared"}
        if cold and args.warm:
            rows, failed = run_child("--first-call", case.to_json(), logs, root / group)
            if failed:
                failures.append(f"{job.family} {job.workload} {case.variant.label} warm "
                                f"first call {failed}")
            else:
                warm = rows[0]
                first.update(first_call_warm_s=warm["first_call_s"],
                             warm_ok=warm["first_call_ok"],
                             **{f"warm_{key}": value for key, value in warm.items()
                                if key.startswith("fc_") or key in (
                                    "cute_compiled", "fx_hits", "fx_misses", "autotunings",
                                    "retimed", "cutlass_imported")})
        figures[case.variant] = first
    return figures, failures


def run(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[str]]:
    """Every job of the run (first calls, then the interleaved process): the rows and the
    failures."""
    rows: list[dict[str, Any]] = []
    failures: list[str] = []
    root = Path(tempfile.mkdtemp(prefix="cutedsl-bench-model-"))
    logs = args.out / "logs"
    for job in jobs_of(args):
        figures: dict[Variant, dict[str, Any]] = {}
        if args.first_calls:
            figures, failed = _first_call_figures(job, args, root, logs)
            failures += failed
        print(f"--- {job.family} {job.workload}: {len(job.shapes)} shape(s) x "
              f"{len(job.variants)} variant(s)", flush=True)
        job_rows, failed = run_child("--job", job.to_json(), logs)
        if failed:
            failures.append(f"{job.family} {job.workload} {failed}")
        first = job.shapes[0]
        for row in job_rows:
            if (row["batch"], row["seq"], row["graphs"]) == (first.batch, first.seq, first.graphs):
                row.update(figures.get(Variant.of_row(row), {}))
        for row in job_rows:
            print(line(row), flush=True)
            for text in (describe(row), describe(row, warm=True)):
                if text:
                    print(f"    first call {text}", flush=True)
        rows += job_rows
        if rows:
            write_csv(rows, args.out / f"{file_stem(rows)}.csv")
    add_first_call_ratios(rows)
    if rows:
        write_csv(rows, args.out / f"{file_stem(rows)}.csv")
    return rows, failures


def _parse_tokens(text: str) -> tuple[int, int]:
    batch, _, seq = text.partition("x")
    if not (batch.isdigit() and seq.isdigit() and int(batch) > 0 and int(seq) > 0):
        raise argparse.ArgumentTypeError(f"--tokens {text!r}: expected BATCHxSEQ, e.g. 4x2048")
    return int(batch), int(seq)


def _counts(option: str) -> Any:
    def parse(text: str) -> tuple[int, ...]:
        parts = text.split(",")
        if not all(p.isdigit() and int(p) > 0 for p in parts):
            raise argparse.ArgumentTypeError(f"{option} {text!r}: positive integers, "
                                             "comma-separated")
        return tuple(int(p) for p in parts)

    return parse


def _switches(option: str, values: dict[str, Any]) -> Any:
    """The parser of ``option``'s values: a comma-separated list of ``values``' keys."""
    def parse(text: str) -> list[Any]:
        parts = text.split(",")
        if any(p not in values for p in parts):
            raise argparse.ArgumentTypeError(f"{option} {text!r}: {', '.join(values)} or a list")
        return [values[p] for p in parts]

    return parse


_SETTING = {"on": True, "off": False, "default": None}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--families", type=one_of(tuple(FAMILIES), "family", all_of=True),
                   default=list(FAMILIES))
    p.add_argument("--workloads", type=one_of(WORKLOADS, "workload", all_of=True),
                   default=list(WORKLOADS))
    p.add_argument("--variants", type=one_of(NAMES, "variant", all_of=True),
                   default=list(DEFAULT_VARIANTS))
    p.add_argument("--fusion", type=_switches("--fusion", _SETTING), default=[None],
                   help="cutedsl's epilogue fusion: on, off, default (the package's) or a list")
    p.add_argument("--pdl", type=_switches("--pdl", _SETTING), default=[None],
                   help="cutedsl's GEMMs with programmatic dependent launch "
                        "(config.gemm_pdl): on, off, default or a list")
    p.add_argument("--prologue", type=_switches("--prologue", _SETTING), default=[None],
                   help="cutedsl's prologue fusion (config.prologue_fusion): on, off, "
                        "default or a list")
    p.add_argument("--sdpa", type=_switches("--sdpa", _SETTING), default=[None],
                   help="cutedsl's SDPA choice set (config.sdpa: the model's attention "
                        "autotuned over SDPA's backends and ours): on, off, default or a list")
    p.add_argument("--levers", action="store_true",
                   help="cutedsl at the package's settings, then with each lever (fusion, "
                        "pdl, prologue, sdpa) flipped alone, in the same rounds (instead of "
                        "--fusion, --pdl, --prologue and --sdpa)")
    p.add_argument("--layers", type=parse_count, default=8)
    p.add_argument("--tokens", type=_parse_tokens, default=None,
                   help="BATCHxSEQ for prefill, small-m and train (default: each one's own)")
    p.add_argument("--contexts", type=_counts("--contexts"), default=None,
                   help=f"decode's prompt lengths (default {','.join(map(str, CONTEXTS))})")
    p.add_argument("--batches", type=_counts("--batches"), default=None,
                   help=f"decode's batch sizes (default {','.join(map(str, BATCHES))})")
    p.add_argument("--new-tokens", type=parse_count, default=32,
                   help="tokens each timed decode unit generates")
    p.add_argument("--graphs", type=_switches("--graphs", {"on": True, "off": False}),
                   default=[False, True], help="decode and small-m without (off) and/or "
                   "under (on) CUDA graphs (default off,on)")
    p.add_argument("--steps", type=parse_count, default=None,
                   help="timed units (steps; decode: generations) per variant per round "
                        "(default 5)")
    p.add_argument("--rounds", type=parse_rounds, default=None,
                   help="interleaved rounds (default 7); the median round ratio counts")
    p.add_argument("--warmup", type=parse_count, default=3,
                   help="units per variant before the rounds (compiles, records graphs)")
    p.add_argument("--quick", action="store_true",
                   help="decode at context 1024 and batch 8 alone, 5 rounds of 3 units")
    p.add_argument("--profile", type=parse_count, default=0, metavar="N",
                   help="also run N units under torch.profiler: GPU ms per step by kernel "
                   "category, and the time no kernel ran (default 0: off)")
    p.add_argument("--no-first-calls", dest="first_calls", action="store_false",
                   help="skip the first calls in fresh processes (cold and warm)")
    p.add_argument("--no-warm", dest="warm", action="store_false",
                   help="skip the warm second process of each first call")
    p.add_argument("--out", type=output_folder, default=Path("bench-out"),
                   help="folder for model_bench_<gpu>.csv and .png, and the logs")


def settle(args: argparse.Namespace) -> argparse.Namespace:
    """The options ``--quick`` or the defaults give where none was given."""
    preset = QUICK if args.quick else {"contexts": CONTEXTS, "batches": BATCHES, "rounds": 7,
                                       "steps": 5}
    for name, value in preset.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    limit = min((FAMILIES[f].max_seq for f in args.families if FAMILIES[f].decoder),
                default=None)
    if "decode" in args.workloads and limit and max(args.contexts) + args.new_tokens > limit:
        raise SystemExit(f"bench model: a context of {max(args.contexts)} and "
                         f"{args.new_tokens} new tokens pass the {limit} positions of a family")
    return args


def main(args: argparse.Namespace) -> int:
    import torch

    if not torch.cuda.is_available():
        print("bench model needs an sm_90 GPU")
        return 2
    if importlib.util.find_spec("transformers") is None:
        print("bench model needs transformers: pip install 'cutedsl-inductor[bench]'")
        return 2
    rows, failures = run(settle(args))
    print(summary(rows))
    print(profile_table(rows))
    if rows:
        stem = file_stem(rows)
        plot(rows, args.out / f"{stem}.png")
        print(f"\nwrote {args.out / stem}.csv and .png")
    for failure in failures:
        print(f"\nFAILED: {failure}")
    ok = all(r["ok"] and r.get("first_call_ok", True) and r.get("warm_ok", True) for r in rows)
    return 0 if ok and not failures else 1


def _child(kind: str, payload: str) -> None:
    import torch

    environment = {"gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                   "torch": torch.__version__}
    rows = ([measure_first_call(FirstCall.from_json(payload))] if kind == "--first-call"
            else measure_job(Job.from_json(payload)))
    for row in rows:
        print(ROW + json.dumps(environment | row), flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] in ("--job", "--first-call"):
        _child(sys.argv[1], sys.argv[2])
    else:
        sys.exit("usage: python -m cutedsl_inductor bench model ...")
