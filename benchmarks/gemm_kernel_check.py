#!/usr/bin/env python3
"""Correctness + speed check of the Hopper GEMM template on a real sm_90 GPU.

    python benchmarks/gemm_kernel_check.py [--quick] [--configs 0,3] [--out DIR]

1. Correctness: every config of ``DEFAULT_CONFIGS`` (or ``--configs``) runs a
   set of cases (tails, padded leading dimensions, batched L=3, all A/B
   majors, bias + alpha/beta, fp16, fp32 output) against a float64 reference.
   Outputs are poisoned with NaN first; a case passes when
   ||out - ref|| / ||ref|| < tol (1e-2 for 16-bit outputs, 1e-4 for fp32),
   no NaN is left inside the problem, and the padding columns of C beyond N
   are still NaN (the TMA store must clip).
2. Speed: bf16 shapes, every config, median of ``triton.testing.do_bench``
   (CUDA events as a fallback), against ``torch.mm`` (cuBLAS), same layout.

Writes only to stdout, plus ``results.csv`` under ``--out DIR`` if given.
A config that fails to compile or is wrong prints FAIL and the run goes on.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time
import traceback

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

# (name, m, n, k, l, a_major, b_major, ab, out, bias, alpha, beta, pad)
# bias: None | "row" (addmm vector, stride 0 along M) | "full" (M x N x L)
# pad: extra elements added to every leading dimension (exercises lda != K).
CORRECTNESS_CASES = [
    ("square1000", 1000, 1000, 1000, 1, "k", "k", "bf16", "bf16", None, 1.0, 0.0, 0),
    ("tails129x257x65", 129, 257, 65, 1, "k", "k", "bf16", "bf16", None, 1.0, 0.0, 7),
    ("batched_L3", 200, 136, 320, 3, "k", "k", "bf16", "bf16", None, 1.0, 0.0, 0),
    ("a_m_major", 1000, 1000, 1000, 1, "m", "k", "bf16", "bf16", None, 1.0, 0.0, 0),
    ("b_n_major", 1000, 1000, 1000, 1, "k", "n", "bf16", "bf16", None, 1.0, 0.0, 0),
    ("both_mn_major_tails", 129, 257, 65, 2, "m", "n", "bf16", "bf16", None, 1.0, 0.0, 7),
    ("row_bias_alpha_beta", 1000, 1000, 1000, 1, "k", "n", "bf16", "bf16", "row", 0.5, 2.0, 0),
    ("full_bias_batched", 129, 257, 65, 3, "k", "k", "bf16", "bf16", "full", 1.5, -1.0, 7),
    ("fp16", 1000, 1000, 1000, 1, "k", "k", "fp16", "fp16", None, 1.0, 0.0, 0),
    ("fp32_out_bias", 129, 257, 65, 1, "k", "k", "bf16", "fp32", "row", 1.0, 1.0, 7),
    ("k_tiny", 300, 500, 8, 1, "k", "k", "bf16", "bf16", None, 1.0, 0.0, 0),
]
QUICK_CASES = {"square1000", "tails129x257x65", "batched_L3", "both_mn_major_tails",
               "row_bias_alpha_beta"}

PERF_SHAPES = [  # (m, n, k)
    (4096, 4096, 4096),
    (8192, 8192, 8192),
    (8192, 14336, 4096),
    (128, 8192, 8192),
]


def _round_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def make_mk_operand(rows: int, cols: int, l: int, major: str, dtype: torch.dtype,
                    pad: int = 0, fill: str = "randn") -> torch.Tensor:
    """A (rows, cols, L) view.  major == "k": cols contiguous (stride (ld, 1, batch));
    otherwise rows contiguous (stride (1, ld, batch)).  ld is padded to 16 bytes."""
    align = 16 // torch.empty((), dtype=dtype).element_size()
    if major == "k":
        ld = _round_up(cols, align) + _round_up(pad, align)
        store = torch.empty((l, rows, ld), dtype=dtype, device="cuda")
        view = store[:, :, :cols].permute(1, 2, 0)
    else:
        ld = _round_up(rows, align) + _round_up(pad, align)
        store = torch.empty((l, cols, ld), dtype=dtype, device="cuda")
        view = store[:, :, :rows].permute(2, 1, 0)
    if fill == "randn":
        view.copy_(torch.randn(view.shape, device="cuda", dtype=torch.float32))
    elif fill == "nan":
        store.fill_(float("nan"))
    view.padded_storage = store  # (L, rows_or_cols, ld) allocation behind the view
    return view


def make_output(m: int, n: int, l: int, dtype: torch.dtype, pad: int = 0) -> torch.Tensor:
    """Row-major C as an (M, N, L) view, NaN-poisoned including its padding."""
    return make_mk_operand(m, n, l, "k", dtype, pad, fill="nan")


def make_bias(kind, m, n, l, dtype):
    if kind is None:
        return None, None
    if kind == "row":
        vec = torch.randn(n, device="cuda", dtype=torch.float32).to(dtype)
        return vec.as_strided((m, n, l), (0, 1, 0)), vec
    full = torch.randn((l, m, n), device="cuda", dtype=torch.float32).to(dtype)
    return full.permute(1, 2, 0), full


def reference(a, b, bias, alpha, beta):
    ref = torch.einsum("mkl,nkl->mnl", a.double(), b.double()) * alpha
    if bias is not None:
        ref = ref + beta * bias.double()
    return ref


def rel_err(out, ref) -> float:
    if torch.isnan(out).any():
        return float("nan")
    return (torch.linalg.vector_norm(out.double() - ref)
            / torch.linalg.vector_norm(ref).clamp_min(1e-30)).item()


def jit_provider(cfg, ab, out, a_major, b_major, bias_dtype):
    """Compile a variant with the CuTe DSL JIT (TVM-FFI ABI)."""
    from cutedsl_inductor.templates.gemm.standalone import compile_sm90_gemm

    return compile_sm90_gemm(cfg, ab_dtype=ab, out_dtype=out, a_major=a_major,
                             b_major=b_major, bias_dtype=bias_dtype)


def run_case(fn, case) -> tuple:
    (name, m, n, k, l, a_major, b_major, ab, out, bias_kind, alpha, beta, pad) = case
    torch.manual_seed(hash(name) % 1000)
    a = make_mk_operand(m, k, l, a_major, TORCH_DTYPES[ab], pad)
    b = make_mk_operand(n, k, l, b_major, TORCH_DTYPES[ab], pad)
    c = make_output(m, n, l, TORCH_DTYPES[out], pad)
    bias, _keep = make_bias(bias_kind, m, n, l, TORCH_DTYPES[out])
    fn(a, b, c, bias, alpha, beta)
    torch.cuda.synchronize()
    ref = reference(a, b, bias, alpha, beta)
    err = rel_err(c, ref)
    tol = 1e-4 if out == "fp32" else 1e-2
    ok = (not math.isnan(err)) and err < tol
    note = ""
    # Everything past column N of the padded C allocation must be untouched.
    store = c.padded_storage
    if store.shape[2] > n and not torch.isnan(store[:, :, n:]).all():
        ok, note = False, "wrote past N"
    return ok, err, note


def bench_ms(fn, warmup_ms=100, rep_ms=500) -> float:
    try:
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
    except ImportError:
        pass
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    times.sort()
    return times[len(times) // 2]


def main(argv=None, provider=None, configs=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="", help="comma-separated DEFAULT_CONFIGS indices")
    ap.add_argument("--quick", action="store_true", help="fewer correctness cases")
    ap.add_argument("--no-perf", action="store_true")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--b-major", default="k", choices=["k", "n"],
                    help="B layout for timing: k = x @ W.T (nn.Linear), n = x @ W")
    ap.add_argument("--out", default=None, help="directory for results.csv")
    args = ap.parse_args(argv)

    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    if configs is None:
        from cutedsl_inductor.templates.gemm.heuristic import DEFAULT_CONFIGS

        configs = list(DEFAULT_CONFIGS)
    idx = [int(x) for x in args.configs.split(",") if x.strip()] or list(range(len(configs)))
    provider = provider or jit_provider

    rows = []
    n_fail = 0
    compiled = {}

    def get(cfg, ab, out, a_major, b_major, bias_dtype):
        key = (cfg.name, ab, out, a_major, b_major, bias_dtype)
        if key not in compiled:
            t0 = time.time()
            try:
                compiled[key] = (provider(cfg, ab, out, a_major, b_major, bias_dtype),
                                 time.time() - t0, "")
            except Exception as e:  # noqa: BLE001 - report and go on
                compiled[key] = (None, time.time() - t0, f"{type(e).__name__}: {e}")
                traceback.print_exc(limit=3)
        return compiled[key]

    if not args.no_check:
        print("\n== correctness ==")
        cases = [c for c in CORRECTNESS_CASES if not args.quick or c[0] in QUICK_CASES]
        for ci in idx:
            for case in cases:
                (name, m, n, k, l, a_major, b_major, ab, out, bias_kind, *_r) = case
                bias_dtype = out if bias_kind else None
                cfg = configs[ci]
                if (n * TORCH_DTYPES[out].itemsize) % 16:
                    cfg = cfg.replace(store="direct")  # the TMA store needs 16-byte rows
                cname = cfg.name
                fn, ct, err_msg = get(cfg, ab, out, a_major, b_major, bias_dtype)
                if fn is None:
                    status, err, note = "FAIL", float("nan"), "compile: " + err_msg[:120]
                else:
                    try:
                        ok, err, note = run_case(fn, case)
                        status = "ok" if ok else "FAIL"
                    except Exception as e:  # noqa: BLE001
                        status, err, note = "FAIL", float("nan"), f"{type(e).__name__}: {e}"[:160]
                n_fail += status != "ok"
                print(f"{status:4s} {cname:39s} {name:22s} rel_err={err:.2e} {note}")
                rows.append(dict(kind="check", config=cname, case=name, status=status,
                                 rel_err=err, note=note))

    if not args.no_perf:
        print("\n== performance (bf16, A k-major, B %s-major) ==" % args.b_major)
        table = []
        for (m, n, k) in PERF_SHAPES:
            flops = 2.0 * m * n * k
            a = make_mk_operand(m, k, 1, "k", torch.bfloat16)
            b = make_mk_operand(n, k, 1, args.b_major, torch.bfloat16)
            c = make_output(m, n, 1, torch.bfloat16)
            a2, b2 = a[:, :, 0], b[:, :, 0]
            ms_ref = bench_ms(lambda: torch.mm(a2, b2.t()))
            ref = torch.mm(a2, b2.t())
            best = None
            for ci in idx:
                cname = configs[ci].name
                fn, _, err_msg = get(configs[ci], "bf16", "bf16", "k", args.b_major, None)
                if fn is None:
                    print(f"FAIL {cname} {m}x{n}x{k}: compile: {err_msg[:100]}")
                    continue
                try:
                    c.fill_(float("nan"))
                    fn(a, b, c, None, 1.0, 0.0)
                    torch.cuda.synchronize()
                    err = rel_err(c[:, :, 0], ref.double())
                    if not err < 2e-2:
                        print(f"FAIL {cname} {m}x{n}x{k}: rel_err={err:.2e}")
                        n_fail += 1
                        continue
                    ms = bench_ms(lambda: fn(a, b, c, None, 1.0, 0.0))
                except Exception as e:  # noqa: BLE001
                    print(f"FAIL {cname} {m}x{n}x{k}: {type(e).__name__}: {e}"[:200])
                    n_fail += 1
                    continue
                tf = flops / ms * 1e-9
                print(f"     {cname:32s} {m}x{n}x{k}: {ms:.3f} ms {tf:7.1f} TFLOP/s")
                rows.append(dict(kind="perf", config=cname, case=f"{m}x{n}x{k}", status="ok",
                                 ms=ms, tflops=tf, cublas_ms=ms_ref,
                                 cublas_tflops=flops / ms_ref * 1e-9))
                if best is None or ms < best[1]:
                    best = (cname, ms)
            tf_ref = flops / ms_ref * 1e-9
            if best:
                tf = flops / best[1] * 1e-9
                table.append((f"{m}x{n}x{k}", best[0], tf, tf_ref, tf / tf_ref))
            else:
                table.append((f"{m}x{n}x{k}", "-", float("nan"), tf_ref, float("nan")))
            del a, b, c, a2, b2, ref
            torch.cuda.empty_cache()
        print(f"\n{'shape':>18s} {'best config':32s} {'ours TF/s':>10s} "
              f"{'cuBLAS TF/s':>12s} {'ratio':>6s}")
        for shape, cname, tf, tf_ref, ratio in table:
            print(f"{shape:>18s} {cname:32s} {tf:10.1f} {tf_ref:12.1f} {ratio:6.2f}")

    if args.out:
        os.makedirs(args.out, exist_ok=True)
        keys = ["kind", "config", "case", "status", "rel_err", "note", "ms", "tflops",
                "cublas_ms", "cublas_tflops"]
        with open(os.path.join(args.out, "results.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            for r in rows:
                w.writerow({k: r.get(k, "") for k in keys})
    print(f"\n{n_fail} failure(s)")
    return 1 if n_fail else 0


if __name__ == "__main__":
    sys.exit(main())
