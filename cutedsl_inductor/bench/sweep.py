"""``python -m cutedsl_inductor bench sweep``: GEMM configs per shape, every candidate
the heuristic ranks (not only the ``config.gemm_max_configs`` it offers) plus variants of
each, through the template path (as Inductor runs them), timed against cuBLAS in one run
(bf16).

    python -m cutedsl_inductor bench sweep --shapes 128x4096x4096,256x4096x14336 \\
        [--layouts nt,nn] [--variant tile_k=128] [--ranked 8] [--top 12] [--rounds 5]

``--swiglu`` sweeps SwiGLU's two-weight kernel instead (``silu(a @ b1) * (a @ b3)``, the
configs ``swiglu_configs`` ranks), timed against two cuBLAS GEMMs alone.
``--variant key=value[,key=value...]`` (repeatable) adds, for every candidate, a copy
with those fields replaced, where the result is a valid config; ``--ranked N`` keeps the
heuristic's first N candidates only (and their variants).  ``--precompile`` needs no GPU: it only
compiles every config into the kernel cache (``CUTEDSL_INDUCTOR_CACHE_DIR``), so that
a GPU run with the same cache only times.  Per shape and layout the GPU run prints the
``--top`` fastest configs with TFLOP/s, the ratio to cuBLAS and the heuristic's rank
of the config ("-": not offered by default), after checking every result against
float64 (relative error < 2e-2; a failure is reported and counted).  ``--rounds N``
times cuBLAS and the configs in turn, N rounds, and ranks them by their median round:
under the power cap the clock drifts, and on the H200 one config's figure differed by
10% between two single-round sweeps of the same shape.  ``--clocks N`` adds
the SM clock and board power (``nvidia-smi``) while cuBLAS and each of the N fastest
configs run back to back: under the power cap a kernel that spends less energy per
cycle holds a higher clock.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import statistics
from typing import Any

import torch
from torch._inductor import ir

from .. import config
from ..autotune.scratch import scratch_graph
from ..autotune.timing import interleaved_ms
from ..kernels.gemm.config import GemmConfig, config_error
from ..kernels.gemm.heuristic import pick_configs, swiglu_configs
from ..kernels.gemm.template import gemm_choices, swiglu_choices
from .args import parse_count, parse_layouts, parse_rounds, parse_shapes
from .gemm import checked_run, operands
from .timing import clock_and_power


def parse_variant(text: str) -> dict[str, Any]:
    """``"tile_n=224,tile_k=64"`` -> ``{"tile_n": 224, "tile_k": 64}`` (values as Python
    literals, else strings; keys: ``GemmConfig``'s fields)."""
    fields = {}
    known = [field.name for field in dataclasses.fields(GemmConfig)]
    for item in text.split(","):
        key, _, value = item.partition("=")
        if not key or not value:
            raise argparse.ArgumentTypeError(f"{item!r} is not key=value")
        if key not in known:
            raise argparse.ArgumentTypeError(
                f"{key!r} is not a GEMM config field (one of {', '.join(known)})")
        try:
            fields[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            fields[key] = value
    return fields


def sweep_configs(m: int, n: int, k: int, variants: list[dict[str, Any]],
                  ranked_limit: int = 10_000, swiglu: bool = False
                  ) -> list[tuple[GemmConfig, int | None]]:
    """(config, heuristic rank or None) for the first ``ranked_limit`` ranked candidates
    (of the two-weight kernel with ``swiglu``) and their valid variants."""
    ranked = (swiglu_configs if swiglu else pick_configs)(m, n, k, max_configs=ranked_limit)
    # The ranked candidates first: a variant that renames to one of them (stages=12 of a
    # candidate that has its own 12-stage entry) must not hide its rank.
    entries = [(cfg, rank if rank < config.gemm_max_configs else None)
               for rank, cfg in enumerate(ranked)]
    entries += [(dataclasses.asdict(cfg) | fields, None) for cfg in ranked for fields in variants]
    configs, seen = [], set()
    for candidate, rank in entries:
        if not isinstance(candidate, GemmConfig):
            if config_error(**candidate) is not None:
                continue
            candidate = GemmConfig(**candidate)
        if candidate.name in seen:
            continue
        seen.add(candidate.name)
        configs.append((candidate, rank))
    return configs


def sweep_choices(m: int, n: int, k: int, layout: str, variants: list[dict[str, Any]],
                  ranked_limit: int, swiglu: bool = False
                  ) -> list[tuple[GemmConfig, int | None, Any]]:
    """(config, rank, template choice) for the configs the kernel can run here."""
    b_stride = (1, k) if layout == "nt" else (n, 1)
    out = []
    with scratch_graph() as scratch:
        nodes = [scratch.input((m, k), torch.bfloat16)]
        nodes += [scratch.input((k, n), torch.bfloat16, b_stride) for _ in range(1 + swiglu)]
        out_layout = ir.FixedLayout(torch.device("cuda", 0), torch.bfloat16, [m, n])
        for cfg, rank in sweep_configs(m, n, k, variants, ranked_limit, swiglu):
            choices: list[Any] = []
            if swiglu:
                swiglu_choices(choices, nodes, out_layout, configs=[cfg])
            else:
                gemm_choices(choices, "mm", nodes, out_layout, configs=[cfg])
            out += [(cfg, rank, choice) for choice in choices]
    return out


def time_choices(m: int, n: int, k: int, layout: str, entries: list, top: int,
                 swiglu: bool = False, clocks: int = 0, rounds: int = 1) -> int:
    """Print the ``top`` fastest configs of one shape; return how many were wrong."""
    a, b = operands(m, n, k, torch.bfloat16, layout)
    weights = [b] + [operands(m, n, k, torch.bfloat16, layout)[1] for _ in range(swiglu)]
    products = [a.double() @ w.double() for w in weights]
    reference = (torch.nn.functional.silu(products[0]) * products[1] if swiglu
                 else products[0])
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    flops = 2 * m * n * k * len(weights)
    fns = {"cuBLAS": lambda: [torch.mm(a, w) for w in weights]}
    ranked, failures = [], 0
    for cfg, rank, choice in entries:
        try:
            run = checked_run(choice, (a, *weights), out, reference)
        except Exception as err:  # a failing config is reported, the others go on
            failures += 1
            print(f"  FAILED {cfg.name}: {type(err).__name__}: {err}")
            continue
        fns[cfg.name] = lambda run=run: run(a, *weights, out)
        ranked.append((cfg, rank))
    times = interleaved_ms(fns, rounds)
    tflops = {name: flops / statistics.median(ms) / 1e9 for name, ms in times.items()}
    cublas = tflops["cuBLAS"]
    rows = sorted(((tflops[cfg.name], cfg, rank) for cfg, rank in ranked),
                  key=lambda row: -row[0])
    print(f"\n{m}x{n}x{k} {layout}: cuBLAS {cublas:.0f} TFLOP/s; {len(rows)} configs")
    for rate, cfg, rank in rows[:top]:
        print(f"  {cfg.name:36s} {rate:6.0f} {rate / cublas:5.2f}  "
              f"rank {'-' if rank is None else rank}")
    offered = [row for row in rows if row[2] is not None]
    if rows and offered:
        print(f"  best offered / best swept: {offered[0][0] / rows[0][0]:.2f}")
    if clocks:
        print_clocks({name: fns[name] for name in
                      ["cuBLAS"] + [cfg.name for _, cfg, _ in rows[:clocks]]})
    return failures


def print_clocks(fns: dict[str, Any]) -> None:
    """SM clock and board power while each function runs back to back."""
    for name, fn in fns.items():
        mhz, watts = clock_and_power(fn)
        print(f"  {name:36s} SM {mhz:5.0f} MHz {watts:4.0f} W")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shapes", type=parse_shapes, required=True, metavar="MxNxK,...")
    parser.add_argument("--layouts", type=parse_layouts, default=["nt"], metavar="nt,nn")
    parser.add_argument("--variant", type=parse_variant, action="append", default=[],
                        metavar="KEY=VALUE,...",
                        help="also every candidate with these fields (repeatable)")
    parser.add_argument("--ranked", type=parse_count, default=10_000, metavar="N",
                        help="only the heuristic's first N candidates (and their variants)")
    parser.add_argument("--top", type=parse_count, default=12, metavar="N",
                        help="print the N fastest configs per shape")
    parser.add_argument("--clocks", type=int, default=0, metavar="N",
                        help="SM clock and power of cuBLAS and the N fastest configs")
    parser.add_argument("--rounds", type=parse_rounds, default=1, metavar="N",
                        help="time cuBLAS and every config in turn, N rounds (medians)")
    parser.add_argument("--swiglu", action="store_true",
                        help="the two-weight kernel, against two cuBLAS GEMMs")
    parser.add_argument("--precompile", action="store_true",
                        help="compile every config into the kernel cache (no GPU needed)")


def main(args: argparse.Namespace) -> int:
    if not args.precompile and not torch.cuda.is_available():
        print("bench sweep needs an sm_90 GPU (or --precompile)")
        return 2
    failures = 0
    with config.patch(arch="sm_90a", disk_cache=True):
        for m, n, k in args.shapes:
            for layout in args.layouts:
                entries = sweep_choices(m, n, k, layout, args.variant, args.ranked,
                                        args.swiglu)
                if args.precompile:
                    failures += precompile(entries)
                    print(f"{m}x{n}x{k} {layout}: {len(entries)} configs compiled or cached")
                else:
                    failures += time_choices(m, n, k, layout, entries, args.top, args.swiglu,
                                             args.clocks, args.rounds)
    print(f"\n{failures} failure(s)")
    return 1 if failures else 0


def precompile(entries: list[tuple[GemmConfig, int | None, Any]]) -> int:
    """Build (or find in the cache) every entry's kernel; return how many failed."""
    failures = 0
    for cfg, _, choice in entries:
        try:
            choice.load()
        except Exception as err:  # a failing config is reported, the others go on
            failures += 1
            print(f"  FAILED {cfg.name}: {type(err).__name__}: {err}")
    return failures
