"""Where an AOTInductor package's load dies (docs/aot.md, "Package load crash"): small
packages with and without our kernels, each loaded where CuTe DSL does not import.

    python -m benchmarks.aot_debug [--out DIR] [--device cuda|cpu] [--given-only] [PACKAGE ...]
    bash benchmarks/gpu_all.sh aot_debug     # after an aot step: its Llama packages too

Builds, in this process, a bf16 GEMM with a ReLU (256x512x512) as AOTInductor packages:
``ours_const`` (our GEMM, the weight a constant of the package), ``ours_inputs`` (our
GEMM, the weight an input: no constants), ``aten_const`` (ATen's GEMM, the weight a
constant, ``config.aot`` on as in ``bench aot``) and ``ours_stripped`` (``ours_const``
without its ``.cutedsl`` files: a load that then passes points at them; the first call
must then fail, cleanly, naming the missing file). Each is loaded and called once in a
fresh process by ``cutedsl_inductor/bench/aot_run.py`` (CuTe DSL, TVM-FFI and this
package blocked, ``CUTEDSL_AOT_TRACE=1``); ``ours_const`` once more in a process that
imported CuTe DSL first. Every ``PACKAGE`` given (e.g. ``bench aot``'s Llama packages) is
loaded the same way, without a call (``--given-only``: those alone, nothing
built). A process that dies of a signal is run again under
``gdb -batch`` (its backtrace: the library and function that faulted) and with
``LD_DEBUG=files`` (the last libraries it opened). One line per package and result; logs
in DIR. On a CPU (``--device cpu``, the default without a GPU) only ``aten_const`` is built
(float32): the flow without our kernels, as tests run it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import torch

from cutedsl_inductor import config
from cutedsl_inductor.bench import aot_run
from cutedsl_inductor.compile.exported import SHIPPED_SUFFIX

SHAPE = (256, 512, 512)  # M, N, K
TIMEOUT_S = 300
# the child that only loads a package (the crash came in the load): aot_run's import block
LOAD_ONLY = (
    "import sys, json, time; sys.path.insert(0, sys.argv[1]); import aot_run; "
    "aot_run.block_imports(); import torch; "
    "torch.cuda.is_available() and torch.empty(1, device='cuda'); start = time.perf_counter(); "
    "torch._inductor.aoti_load_package(sys.argv[2]); "
    "print(aot_run.RESULT + json.dumps({'load_s': time.perf_counter() - start}), flush=True)")
WITH_CUTE_DSL = (
    "import sys, json, cutlass, cutedsl_inductor, torch; torch.empty(1, device='cuda'); "
    "torch._inductor.aoti_load_package(sys.argv[1]); "
    "print('RESULT ' + json.dumps({'loaded_with_cute_dsl': True}), flush=True)")


class Linear(torch.nn.Module):
    """relu(x @ weight.T), the weight a constant of the exported program."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.weight = torch.nn.Parameter(weight, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ self.weight.t())


class Matmul(torch.nn.Module):
    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ w.t())


def build(module: torch.nn.Module, args: tuple, backends: str, path: Path) -> str:
    """``module`` exported and packaged at ``path`` under max-autotune with ``backends``."""
    exported = torch.export.export(module, args)
    with torch._inductor.config.patch(max_autotune=True, max_autotune_gemm_backends=backends), \
            config.patch(aot=True, gemm_max_configs=1):
        return torch._inductor.aoti_compile_and_package(exported, package_path=str(path))


def stripped(package: Path, path: Path) -> Path:
    """``package`` without its shipped ``.cutedsl`` files."""
    with zipfile.ZipFile(package) as source, zipfile.ZipFile(path, "w") as target:
        for item in source.infolist():
            if not item.filename.endswith(SHIPPED_SUFFIX):
                target.writestr(item, source.read(item))
    return path


def contents(package: Path) -> str:
    with zipfile.ZipFile(package) as archive:
        return ", ".join(f"{Path(i.filename).name} {i.file_size // 1024} KiB"
                         for i in archive.infolist() if "/aotinductor/" in i.filename)


def run_child(argv: list[str], log: Path) -> tuple[int, dict | None]:
    """(return code, RESULT answer) of a traced child; its output in ``log``."""
    env = dict(os.environ, CUTEDSL_AOT_TRACE="1")
    with open(log, "w") as out:
        try:
            done = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=out,
                                  text=True, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return 124, None
        out.write(done.stdout)
    answers = [line.split(" ", 1)[1] for line in done.stdout.splitlines()
               if line.startswith(aot_run.RESULT)]
    return done.returncode, json.loads(answers[-1]) if answers else None


def diagnose(argv: list[str], log: Path) -> list[str]:
    """For a child that died of a signal: the backtrace under gdb and the last libraries
    the dynamic loader opened."""
    lines = []
    gdb = shutil.which("gdb")
    if gdb:
        done = subprocess.run([gdb, "-batch", "-ex", "set pagination off", "-ex", "run",
                               "-ex", "bt 40", "--args", *argv], capture_output=True,
                              text=True, timeout=TIMEOUT_S,
                              env=dict(os.environ, CUTEDSL_AOT_TRACE="1"))
        log.with_suffix(".gdb").write_text(done.stdout + done.stderr)
        out = done.stdout.splitlines()
        start = next((i for i, line in enumerate(out) if "received signal" in line), None)
        lines += ["gdb: " + line for line in (out[start:start + 30] if start is not None
                                              else ["no signal under gdb"] + out[-5:])]
    else:
        lines.append("gdb: not installed")
    prefix = log.with_suffix(".lddebug")
    subprocess.run(argv, capture_output=True, timeout=TIMEOUT_S,
                   env=dict(os.environ, LD_DEBUG="files", LD_DEBUG_OUTPUT=str(prefix)))
    # one file per process; the one that died never reached "calling fini"
    traces = [path.read_text(errors="replace") for path in prefix.parent.glob(prefix.name + ".*")]
    died = [text for text in traces if "calling fini" not in text] or traces
    opened = [line.split(":", 1)[1].strip() for text in died[:1] for line in text.splitlines()
              if "calling init:" in line or "opening file=" in line]
    lines += [f"LD_DEBUG: {line}" for line in opened[-8:]]
    return lines


def report(name: str, argv: list[str], out: Path) -> None:
    log = out / f"{name}.log"
    rc, answer = run_child(argv, log)
    print(f"{name}: rc {rc} {json.dumps(answer) if answer else 'no answer'} (log {log})",
          flush=True)
    if rc < 0:  # killed by a signal
        for line in diagnose(argv, log):
            print(f"  {line}", flush=True)
    elif rc != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-3:]
        for line in tail:
            print(f"  {line}", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.aot_debug")
    parser.add_argument("--out", type=Path, default=Path("/tmp/aot_debug"))
    parser.add_argument("--device", choices=("cuda", "cpu"),
                        default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--given-only", action="store_true",
                        help="load the PACKAGEs given, build none")
    parser.add_argument("packages", nargs="*", type=Path)
    args = parser.parse_args(argv)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    print(f"torch {torch.__version__}, device {args.device}", flush=True)
    m, n, k = SHAPE
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    torch.manual_seed(0)
    x = torch.randn(m, k, device=args.device, dtype=dtype)
    w = torch.randn(n, k, device=args.device, dtype=dtype) / k ** 0.5
    want = torch.relu(x.double() @ w.double().t()).float()
    eager = torch.relu(x @ w.t()).float()
    reference = {"want": want, "eager_error": float((eager - want).norm() / want.norm())}
    torch.save(reference, out / "reference.pt")
    torch.save((x,), out / "inputs_x.pt")
    torch.save((x, w), out / "inputs_xw.pt")
    cases = [] if args.given_only else [("aten_const", Linear(w), (x,), "ATEN", "inputs_x.pt")]
    if args.device == "cuda" and not args.given_only:
        cases = [("ours_const", Linear(w), (x,), "CUTEDSL", "inputs_x.pt"),
                 ("ours_inputs", Matmul(), (x, w), "CUTEDSL", "inputs_xw.pt"), *cases]
    built: dict[str, tuple[Path, str]] = {}
    for name, module, inputs, backends, saved in cases:
        try:
            built[name] = (Path(build(module, inputs, backends, out / f"{name}.pt2")), saved)
        except Exception as err:  # the others still tell
            print(f"{name}: build failed: {type(err).__name__}: {str(err)[:300]}", flush=True)
    if "ours_const" in built:
        built["ours_stripped"] = (stripped(built["ours_const"][0], out / "ours_stripped.pt2"),
                                  "inputs_x.pt")
    runner = [sys.executable, "-X", "faulthandler", aot_run.__file__, "load"]
    for name, (package, saved) in built.items():
        print(f"{name}: {contents(package)}", flush=True)
        payload = {"package": str(package), "inputs": str(out / saved),
                   "reference": str(out / "reference.pt"), "check_stride": 1}
        report(name, [*runner, json.dumps(payload)], out)
    if "ours_const" in built:
        report("ours_const_with_cute_dsl", [sys.executable, "-X", "faulthandler", "-c",
                                            WITH_CUTE_DSL, str(built["ours_const"][0])], out)
    folder = str(Path(aot_run.__file__).parent)
    for i, package in enumerate(args.packages):
        print(f"given_{i}: {package}: {contents(package)}", flush=True)
        report(f"given_{i}", [sys.executable, "-X", "faulthandler", "-c", LOAD_ONLY, folder,
                              str(package)], out)


if __name__ == "__main__":
    main()
