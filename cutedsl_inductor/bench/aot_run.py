"""``bench aot``'s measurements where a package is deployed: a fresh process in which
neither CuTe DSL, TVM-FFI's Python package nor this package imports. Run by path
(``python .../aot_run.py load|time PAYLOAD``), so that it imports torch alone; its payload
is JSON, its answer one ``RESULT`` JSON line.

``load`` (``package``, ``inputs``, ``reference``, ``check_stride``): the package's load
(``aoti_load_package``, timed after the device's context exists), its first call on the
saved inputs, and that call's checked outputs (every ``check_stride``-th position) against
the reference's: the relative Frobenius error, ok within twice eager bf16's plus 1e-3.
``time`` (``packages``, ``inputs``, ``rounds``, ``steps``, ``warmup``): the packages loaded
together, each warmed up, then rounds in which each in turn runs ``steps`` calls between
two synchronizations: every package's ms per step in every round. On a CPU the wall clock
alone times them.
"""

import json
import sys
import time

BLOCKED = ("cutlass", "cutedsl_inductor", "tvm_ffi", "nvidia_cutlass_dsl")
RESULT = "RESULT "


def block_imports() -> None:
    """Importing any of ``BLOCKED`` from now on fails, as where a package is deployed."""
    for name in BLOCKED:
        sys.modules[name] = None  # type: ignore[assignment]


def _sync(torch) -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _device(torch) -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def load(payload: dict) -> dict:
    import torch

    device = _device(torch)
    torch.empty(1, device=device)  # the device's context, before the clock starts
    start = time.perf_counter()
    model = torch._inductor.aoti_load_package(payload["package"])
    load_s = time.perf_counter() - start
    print(f"loaded in {load_s:.2f} s", file=sys.stderr, flush=True)  # how far a crash got
    inputs = torch.load(payload["inputs"], map_location=device)
    reference = torch.load(payload["reference"], map_location=device)
    with torch.no_grad():
        start = time.perf_counter()
        out = model(*inputs)
        _sync(torch)
        first_s = time.perf_counter() - start
    print(f"first call in {first_s:.2f} s", file=sys.stderr, flush=True)
    out = out[0] if isinstance(out, (list, tuple)) else out
    got = out[:, ::payload["check_stride"]].float()
    want = reference["want"]
    error = float((got - want).norm() / want.norm()) if bool(got.isfinite().all()) \
        else float("inf")
    return {"load_s": load_s, "first_call_s": first_s, "error": error,
            "ok": error <= 2 * reference["eager_error"] + 1e-3}


def timed(payload: dict) -> dict:
    import torch

    device = _device(torch)
    inputs = torch.load(payload["inputs"], map_location=device)
    models = [torch._inductor.aoti_load_package(path) for path in payload["packages"]]
    rounds = [[] for _ in models]
    with torch.no_grad():
        for model in models:
            for _ in range(payload["warmup"]):
                model(*inputs)
        for _ in range(payload["rounds"]):
            for model, times in zip(models, rounds):
                _sync(torch)
                start = time.perf_counter()
                for _ in range(payload["steps"]):
                    model(*inputs)
                _sync(torch)
                times.append((time.perf_counter() - start) * 1e3 / payload["steps"])
    return {"ms_per_step": rounds}


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("load", "time"):
        sys.exit("usage: python aot_run.py load|time PAYLOAD")
    block_imports()
    run = load if sys.argv[1] == "load" else timed
    print(RESULT + json.dumps(run(json.loads(sys.argv[2]))), flush=True)
