"""``cutedsl-inductor bench aot``: a transformers Llama packaged by AOTInductor with our
kernels and without them, each package loaded and run where it is deployed (issue #66's
benchmark; docs/aot.md).

Per workload (``aot_build.py``: ``prefill``, 4 x 2048 tokens; ``decode``, one step of
batch 8 at context ``--context``), every stage in a fresh process: the references; the
package built twice (``cutedsl``: ATEN,TRITON,CUTEDSL with ``config.aot``;
``max-autotune``: ATEN,TRITON), each build under a fresh Inductor cache of its own (our
kernel cache is the environment's); each package loaded alone where neither CuTe DSL nor
this package imports (``aot_run.py``: the load's and the first call's seconds, whose sum
is the load time compared, since our kernels' libraries load at their first launch; the
first call's outputs checked against an fp32 copy's); then both timed in one such process
in interleaved rounds (ms per step, the median over rounds; the speedup is the median of
the per-round ratios max-autotune / cutedsl). Prints a line per workload against issue
#66's goals (>= 1.05x prefill, >= 1.10x decode, load <= 1.2x) and writes
``--out``/aot_bench_<gpu>.csv; the packages (a few GB each: they hold the weights) are
deleted unless ``--keep``.

Failure semantics: a stage that fails or runs past its time names its log
(``--out``/logs) and the workload's row says so; the exit status is 1 where any stage
failed or an output was off, 2 without an sm_90 GPU or transformers.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import aot_run
from .aot_build import ROW, VARIANTS, WORKLOADS, Case
from .args import one_of, output_folder, parse_count, parse_rounds

GOALS = {"prefill": 1.05, "decode": 1.10}  # speedup over max-autotune
LOAD_GOAL = 1.2  # load time over max-autotune's, at most
BUILD_TIMEOUT_S = 3600
RUN_TIMEOUT_S = 900


@dataclasses.dataclass(frozen=True)
class Stage:
    """One fresh process of a run: its command and environment overrides."""
    name: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    timeout_s: float = RUN_TIMEOUT_S


def stages(case: Case, args: argparse.Namespace, scratch: Path) -> list[Stage]:
    """The processes of one workload, in order."""
    build = [sys.executable, "-m", "cutedsl_inductor.bench.aot_build"]
    # faulthandler: a process that dies of a signal leaves its Python stack in its log
    run = [sys.executable, "-X", "faulthandler", aot_run.__file__]
    folder = Path(case.folder)
    result = [Stage("reference", (*build, "reference", case.to_json()), timeout_s=BUILD_TIMEOUT_S)]
    for variant in VARIANTS:
        result.append(Stage(f"build {variant}", (*build, "build", case.to_json(), variant),
                            (("TORCHINDUCTOR_CACHE_DIR", str(scratch / variant)),),
                            BUILD_TIMEOUT_S))
    for variant in VARIANTS:
        payload = {"package": str(case.package(variant)), "inputs": str(folder / "inputs.pt"),
                   "reference": str(folder / "reference.pt"),
                   "check_stride": case.check_stride}
        # traced: a load or first launch that dies names its step in the stage's log
        result.append(Stage(f"load {variant}", (*run, "load", json.dumps(payload)),
                            (("CUTEDSL_AOT_TRACE", "1"),)))
    payload = {"packages": [str(case.package(v)) for v in VARIANTS],
               "inputs": str(folder / "inputs.pt"), "rounds": args.rounds,
               "steps": args.steps, "warmup": args.warmup}
    result.append(Stage("time", (*run, "time", json.dumps(payload))))
    return result


def run_stage(stage: Stage, logs: Path) -> tuple[dict[str, Any] | None, str]:
    """The stage's answer (its last ``ROW``/``RESULT`` line) or, where it failed, why."""
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{stage.name.replace(' ', '-')}-{time.time_ns()}.log"
    env = dict(os.environ, **dict(stage.env))
    with open(log, "w") as err:
        err.write(" ".join(stage.argv[:3]) + "\n")
        err.flush()
        try:
            done = subprocess.run(stage.argv, env=env, stdout=subprocess.PIPE, stderr=err,
                                  text=True, timeout=stage.timeout_s)
            stdout, failed = done.stdout, done.returncode != 0 and f"rc {done.returncode}"
        except subprocess.TimeoutExpired as expired:
            stdout, failed = str(expired.stdout or ""), f"over {stage.timeout_s:.0f} s"
    answers = [line.split(" ", 1)[1] for line in stdout.splitlines()
               if line.startswith((ROW, aot_run.RESULT))]
    if failed or not answers:
        return None, f"{stage.name}: {failed or 'no answer'}, log {log}"
    return json.loads(answers[-1]), ""


def summarize(workload: str, answers: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A workload's row from its stages' answers (those that answered)."""
    row: dict[str, Any] = {"workload": workload, **answers.get("reference", {})}
    for variant in VARIANTS:
        for key, value in {**answers.get(f"build {variant}", {}),
                           **answers.get(f"load {variant}", {})}.items():
            row[f"{variant}_{key}"] = value
    timing = answers.get("time", {}).get("ms_per_step")
    if timing:
        ours, base = timing
        row["cutedsl_ms"], row["max-autotune_ms"] = statistics.median(ours), statistics.median(base)
        row["speedup"] = statistics.median(b / o for o, b in zip(ours, base))
        row["speedup_min"] = min(b / o for o, b in zip(ours, base))
    for variant in VARIANTS:  # our kernels' libraries load at their first launch
        if f"{variant}_load_s" in row:
            row[f"{variant}_ready_s"] = row[f"{variant}_load_s"] + row[f"{variant}_first_call_s"]
    if "cutedsl_ready_s" in row and "max-autotune_ready_s" in row:
        row["load_ratio"] = row["cutedsl_ready_s"] / row["max-autotune_ready_s"]
    return row


def line(row: dict[str, Any]) -> str:
    """One workload's figures against its goals."""
    parts = [f"{row['workload']:8s}"]
    if "speedup" in row:
        goal = GOALS[row["workload"]]
        parts.append(f"cutedsl {row['cutedsl_ms']:.3f} ms vs max-autotune "
                     f"{row['max-autotune_ms']:.3f} ms per step: {row['speedup']:.3f}x "
                     f"(rounds' min {row['speedup_min']:.3f}x; goal >= {goal}x "
                     f"{'met' if row['speedup'] >= goal else 'NOT met'})")
    if "load_ratio" in row:
        parts.append(f"load and first call {row['cutedsl_ready_s']:.2f} s vs "
                     f"{row['max-autotune_ready_s']:.2f} s: {row['load_ratio']:.2f}x (goal <= "
                     f"{LOAD_GOAL}x {'met' if row['load_ratio'] <= LOAD_GOAL else 'NOT met'})")
    if "cutedsl_kernels_of_ours" in row:
        parts.append(f"{row['cutedsl_kernels_of_ours']} kernels of ours in the package")
    return "; ".join(parts)


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    fields = list(dict.fromkeys(key for row in rows for key in row))
    with open(path, "w", newline="") as out:
        writer = csv.DictWriter(out, fields)
        writer.writeheader()
        writer.writerows(rows)


def run(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[str]]:
    rows, failures = [], []
    for workload in args.workloads:
        folder = Path(tempfile.mkdtemp(prefix=f"cutedsl-bench-aot-{workload}-",
                                       dir=args.out))
        scratch = folder / "inductor"
        case = Case(workload, args.layers, args.context, str(folder))
        answers: dict[str, dict[str, Any]] = {}
        print(f"--- {workload}: {args.layers} layers", flush=True)
        for stage in stages(case, args, scratch):
            answer, failed = run_stage(stage, args.out / "logs")
            if failed:
                failures.append(f"{workload} {failed}")
                if stage.name.startswith("load"):  # the other package may still load
                    continue
                break
            answers[stage.name] = answer
            print(f"    {stage.name}: {answer}", flush=True)
        rows.append(summarize(workload, answers))
        print(line(rows[-1]), flush=True)
        shutil.rmtree(scratch, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    return rows, failures


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workloads", type=one_of(WORKLOADS, "workload", all_of=True),
                   default=list(WORKLOADS))
    p.add_argument("--layers", type=parse_count, default=2,
                   help="Llama-3-8B-shaped layers (default 2; the package holds the weights)")
    p.add_argument("--context", type=parse_count, default=1024,
                   help="decode's context: the position its step writes (default 1024)")
    p.add_argument("--rounds", type=parse_rounds, default=7,
                   help="interleaved rounds (default 7); the median round ratio counts")
    p.add_argument("--steps", type=parse_count, default=20,
                   help="calls per package per round (default 20)")
    p.add_argument("--warmup", type=parse_count, default=3,
                   help="calls per package before the rounds (default 3)")
    p.add_argument("--keep", action="store_true",
                   help="keep the packages, inputs and references under --out")
    p.add_argument("--out", type=output_folder, default=Path("bench-out"),
                   help="folder for aot_bench_<gpu>.csv and the logs")


def has_sm90() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def main(args: argparse.Namespace) -> int:
    if not has_sm90():
        print("bench aot needs an sm_90 GPU")
        return 2
    if importlib.util.find_spec("transformers") is None:
        print("bench aot needs transformers: pip install 'cutedsl-inductor[bench]'")
        return 2
    import torch

    rows, failures = run(args)
    gpu = torch.cuda.get_device_name().replace(" ", "_")
    write_csv(rows, args.out / f"aot_bench_{gpu}.csv")
    print(f"\nwrote {args.out / f'aot_bench_{gpu}.csv'}")
    for failure in failures:
        print(f"FAILED: {failure}")
    ok = all(row.get(f"{v}_ok", False) for row in rows for v in VARIANTS)
    return 0 if ok and not failures else 1
