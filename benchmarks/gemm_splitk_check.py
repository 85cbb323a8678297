#!/usr/bin/env python3
"""Split-K vs no split for small-M GEMMs on a real sm_90 GPU (bf16, B = w.T).

    python benchmarks/gemm_splitk_check.py [--top 3]

For M in (16, 64, 128, 256) x (N, K) in ((4096, 4096), (14336, 4096), (4096, 14336)):
times (``triton.testing.do_bench`` median) the best of the top ``--top`` unsplit configs
of ``pick_configs``, the best of its top ``--top`` split-K configs (or fixed split-K
candidates where the heuristic proposes none) and ``torch.mm`` (cuBLAS), after checking
every result against ``torch.mm``.  Prints one table row per shape with TFLOP/s and
ratios.  Each config is compiled once (symbolic M/N/K) and reused for every shape.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from cutedsl_inductor.templates.gemm.config import GemmConfig  # noqa: E402

SHAPES = [(m, n, k) for m in (16, 64, 128, 256)
          for n, k in ((4096, 4096), (14336, 4096), (4096, 14336))]
# Split-K configs timed where pick_configs proposes none (tiles already fill the SMs).
FALLBACK_SPLIT_K = [
    GemmConfig(tile_m=64, tile_n=128, tile_k=64, cluster_m=1, cluster_n=1, cooperative=False,
         raster="n", split_k=2),
    GemmConfig(tile_m=128, tile_n=128, tile_k=64, cluster_m=1, cluster_n=1, cooperative=True,
         raster="m", split_k=2),
]
TOLERANCE = 2e-2  # relative Frobenius error against torch.mm (both bf16 outputs)


def bench_ms(fn) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--top", type=int, default=3, help="configs tried per kind and shape")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    from cutedsl_inductor.templates.gemm.standalone import compile_sm90_gemm
    from cutedsl_inductor.templates.gemm.heuristic import pick_configs

    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    from cutlass.utils import HardwareInfo

    # What _split_k_clusters assumes: co-resident clusters of 2, 4 and 8 CTAs. The driver
    # queries need torch's CUDA context current on this thread.
    torch.empty(1, device="cuda")
    hardware = HardwareInfo()
    print("max active clusters of 2/4/8 CTAs:",
          [hardware.get_max_active_clusters(size) for size in (2, 4, 8)])
    compiled: dict[str, object] = {}

    def kernel(cfg):
        name = cfg.name
        if name not in compiled:
            t0 = time.time()
            compiled[name] = compile_sm90_gemm(cfg, "bf16", "bf16", "k", "k")
            print(f"  compiled {name} in {time.time() - t0:.1f}s", flush=True)
        return compiled[name]

    failures = 0
    rows = []
    for m, n, k in SHAPES:
        flops = 2.0 * m * n * k
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)  # x @ w.T, B K-major
        ref = torch.mm(x, w.t())
        ms_cublas = bench_ms(lambda: torch.mm(x, w.t()))
        # The kernel's (M, K, L) / (N, K, L) / (M, N, L) views; batch strides are unused
        # for L == 1 but must be 16-byte multiples.
        a = x.as_strided((m, k, 1), (k, 1, m * k))
        b = w.as_strided((n, k, 1), (k, 1, n * k))
        c_mat = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        c = c_mat.as_strided((m, n, 1), (n, 1, m * n))
        ranked = pick_configs(m, n, k, "bf16", max_configs=32)
        unsplit = [cfg for cfg in ranked if cfg.split_k == 1][:args.top]
        split = [cfg for cfg in ranked if cfg.split_k > 1][:args.top]
        best = {}
        for kind, cfgs in (("unsplit", unsplit), ("split", split or FALLBACK_SPLIT_K)):
            for cfg in cfgs:
                fn = kernel(cfg)
                c_mat.fill_(float("nan"))
                fn(a, b, c, None, 1.0, 0.0)
                torch.cuda.synchronize()
                err = ((c_mat.double() - ref.double()).norm() / ref.double().norm()).item()
                if not err < TOLERANCE:  # also catches NaN
                    print(f"FAIL {cfg.name} {m}x{n}x{k}: rel_err={err:.2e}")
                    failures += 1
                    continue
                ms = bench_ms(lambda: fn(a, b, c, None, 1.0, 0.0))
                if kind not in best or ms < best[kind][1]:
                    best[kind] = (cfg.name, ms)
        rows.append((m, n, k, flops, ms_cublas, best, bool(split)))
    print(f"\n{'M':>4s} {'N':>6s} {'K':>6s} | {'cuBLAS':>7s} | {'best unsplit':30s} {'TF/s':>6s} "
          f"{'/cuB':>5s} | {'best split-K':32s} {'TF/s':>6s} {'/cuB':>5s} {'/unsp':>6s}")
    for m, n, k, flops, ms_cublas, best, proposed in rows:
        tf_ref = flops / ms_cublas * 1e-9
        cells = []
        for kind in ("unsplit", "split"):
            name, ms = best.get(kind, ("-", float("nan")))
            if kind == "split" and not proposed:
                name = "(not proposed) " + name
            cells.append((name, flops / ms * 1e-9))
        (un_name, un_tf), (sp_name, sp_tf) = cells
        print(f"{m:4d} {n:6d} {k:6d} | {tf_ref:7.1f} | {un_name:30s} {un_tf:6.1f} "
              f"{un_tf / tf_ref:5.2f} | {sp_name:32s} {sp_tf:6.1f} {sp_tf / tf_ref:5.2f} "
              f"{sp_tf / un_tf:6.2f}")
    print(f"\n{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
