#!/usr/bin/env python3
"""Ping-pong vs cooperative consumer scheduling of the Hopper GEMM, plain and with a
heavy fused epilogue, on a real sm_90 GPU (well under 2 minutes including compiles).

    python benchmarks/gemm_pingpong_check.py

For every shape (bf16, ``x @ w.T``: A row-major M x K, B = w row-major N x K):

1. torch.mm time; the best of the heuristic's top cooperative configs and the best of
   its top ping-pong configs (``pick_configs``), each checked against torch.mm.
2. The two winners again with a fused epilogue ``gelu_erf(acc) + bias[n]`` (a
   subclass overriding ``epilogue_op``), checked against torch, and eager torch
   (mm, gelu, add) for scale.

Times are medians of ``triton.testing.do_bench`` (CUDA events as a fallback).
Prints a TFLOP/s table (GEMM flops only) with ping-pong / cooperative ratios.
"""

from __future__ import annotations

import os
import sys
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks.gemm_kernel_check import bench_ms, rel_err  # noqa: E402

SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 4096, 4096), (8192, 14336, 4096),
          (1024, 14336, 4096)]
CANDIDATES_PER_KIND = 2  # top cooperative / ping-pong configs of the heuristic, per shape
TOLERANCE = 2e-2


def fused_gemm_class():
    """Sm90Gemm whose epilogue applies gelu (erf form) and a per-column bias."""
    import cutlass
    import cutlass.cute as cute

    from cutedsl_inductor.templates.gemm.sm90_gemm import Sm90Gemm

    class GeluColumnBiasGemm(Sm90Gemm):
        @cute.jit
        def __call__(self, mA, mB, mC, mColBias, stream):
            self.launch(mA, mB, mC, None, cutlass.Float32(1.0), cutlass.Float32(0.0), stream,
                        epi_args=(mColBias,))

        @cute.jit
        def epilogue_op(self, acc, coords, l_idx, prob_m, prob_n, mBias, alpha, beta, epi_args,
                        prefetched):
            col_bias = epi_args[0]
            for i in cutlass.range(cute.size(acc), unroll_full=True):
                v = acc[i]
                v = v * 0.5 * (1.0 + cute.math.erf(v * 0.7071067811865476))
                n = coords[i][1]
                if n < prob_n:
                    v = v + col_bias[n].to(cutlass.Float32)
                acc[i] = v

    return GeluColumnBiasGemm


def compile_plain(cfg):
    from cutedsl_inductor.templates.gemm.standalone import compile_sm90_gemm

    return compile_sm90_gemm(cfg, "bf16", "bf16", "k", "k")


def compile_fused(cfg):
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor
    from cutlass.runtime import make_fake_stream

    from cutedsl_inductor.templates.gemm.standalone import make_fake_gemm_args

    a, b, c, _ = make_fake_gemm_args("bf16", "bf16", "k", "k", store=cfg.store)
    col_bias = make_fake_tensor(cutlass.BFloat16, (cute.sym_int32(),), (1,))
    return cute.compile(fused_gemm_class()(cfg), a, b, c, col_bias,
                        make_fake_stream(use_tvm_ffi_env_stream=True),
                        options="--enable-tvm-ffi")


def as_kernel_view(x: torch.Tensor) -> torch.Tensor:
    """(rows, cols) row-major -> the kernel's (rows, cols, 1) view, batch stride rows*cols."""
    return x.unsqueeze(0).permute(1, 2, 0)


def main() -> int:
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    from cutedsl_inductor.templates.gemm.heuristic import pick_configs

    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    start = time.time()
    compiled: dict = {}

    def kernel(kind, cfg):
        key = (kind, cfg.name)
        if key not in compiled:
            t0 = time.time()
            compiled[key] = (compile_plain if kind == "plain" else compile_fused)(cfg)
            print(f"  compiled {kind:5s} {cfg.name} in {time.time() - t0:.1f} s")
        return compiled[key]

    rows, n_fail = [], 0
    for (m, n, k) in SHAPES:
        print(f"\n== {m}x{n}x{k} ==")
        flops = 2.0 * m * n * k
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        A, B, C = as_kernel_view(x), as_kernel_view(w), as_kernel_view(out)
        ref = torch.mm(x, w.t())
        ref_fused = (torch.nn.functional.gelu(ref.float()) + bias.float()).double()
        ms_torch = bench_ms(lambda: torch.mm(x, w.t()), 25, 100)
        ms_torch_fused = bench_ms(
            lambda: torch.nn.functional.gelu(torch.mm(x, w.t())) + bias, 25, 100)

        ranked = pick_configs(m, n, k, max_configs=64)
        best = {}
        for label, members in (("coop", [c for c in ranked if c.cooperative]),
                               ("pp", [c for c in ranked if c.pingpong])):
            for cfg in members[:CANDIDATES_PER_KIND]:
                fn = kernel("plain", cfg)
                out.fill_(float("nan"))
                fn(A, B, C, None, 1.0, 0.0)
                err = rel_err(out, ref.double())
                if not err < TOLERANCE:
                    print(f"FAIL {cfg.name}: rel_err={err:.2e}")
                    n_fail += 1
                    continue
                ms = bench_ms(lambda: fn(A, B, C, None, 1.0, 0.0), 25, 100)
                print(f"  {label:4s} {cfg.name:28s} {ms:.3f} ms "
                      f"{flops / ms * 1e-9:7.1f} TFLOP/s")
                if label not in best or ms < best[label][1]:
                    best[label] = (cfg, ms)
        fused_ms = {}
        for label, (cfg, _) in best.items():
            fn = kernel("fused", cfg)
            out.fill_(float("nan"))
            fn(A, B, C, bias)
            err = rel_err(out, ref_fused)
            if not err < TOLERANCE:
                print(f"FAIL fused {cfg.name}: rel_err={err:.2e}")
                n_fail += 1
                continue
            fused_ms[label] = bench_ms(lambda: fn(A, B, C, bias), 25, 100)
            print(f"  {label:4s} {cfg.name:28s} fused gelu+bias {fused_ms[label]:.3f} ms")
        rows.append(((m, n, k), flops, ms_torch, ms_torch_fused, best, fused_ms))

    def tf(flops, ms):
        return flops / ms * 1e-9 if ms else float("nan")

    print("\nTFLOP/s (GEMM flops); fused = gelu_erf(acc) + bias[n] in the epilogue")
    print(f"{'shape':>17s} {'torch':>6s} {'coop':>6s} {'pp':>6s} {'pp/coop':>7s} "
          f"{'coop/torch':>10s} {'pp/torch':>8s} | {'eager':>6s} {'coopF':>6s} {'ppF':>6s} "
          f"{'ppF/coopF':>9s} {'coopF/coop':>10s} {'ppF/pp':>6s}  best configs")
    for (m, n, k), flops, ms_t, ms_tf, best, fused in rows:
        t_torch = tf(flops, ms_t)
        t_coop = tf(flops, best["coop"][1]) if "coop" in best else float("nan")
        t_pp = tf(flops, best["pp"][1]) if "pp" in best else float("nan")
        f_coop = tf(flops, fused.get("coop"))
        f_pp = tf(flops, fused.get("pp"))
        names = " / ".join(best[key][0].name for key in ("coop", "pp") if key in best)
        print(f"{f'{m}x{n}x{k}':>17s} {t_torch:6.1f} {t_coop:6.1f} {t_pp:6.1f} "
              f"{t_pp / t_coop:7.2f} {t_coop / t_torch:10.2f} {t_pp / t_torch:8.2f} | "
              f"{tf(flops, ms_tf):6.1f} {f_coop:6.1f} {f_pp:6.1f} {f_pp / f_coop:9.2f} "
              f"{f_coop / t_coop:10.2f} {f_pp / t_pp:6.2f}  {names}")
    print(f"\n{n_fail} failure(s); {len(compiled)} kernels compiled; "
          f"total {time.time() - start:.0f} s")
    return 1 if n_fail else 0


if __name__ == "__main__":
    sys.exit(main())
