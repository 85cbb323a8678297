"""``python -m cutedsl_inductor bench attention``: FlexAttention forward and backward,
ours against Inductor's Triton flex kernel and, on plain causal, SDPA, in one run.

Cases: B x H x S (Q_LEN = KV_LEN, KV heads = Q heads) x head dim x mask x dtype. Masks:
``causal``; ``sliding`` (causal, the last ``WINDOW`` = 1024 keys); ``document`` (causal
within documents: the sequence cut at S / 1024 - 1 random places, seed 0, alike for every
batch and head); ``alibi`` (causal, score + 2^(-8 (h+1) / H) (kv - q)). BlockMasks of
flex's default 128 x 128 blocks.

Variants: ``ours`` is torch.compile(flex_attention) with ``kernel_options={"CUTEDSL":
True, "BACKEND": "TRITON"}`` under ``config.flex_only_ours`` (our forward alone); its
backward is whatever flex's backward lowering builds (Inductor's Triton kernel until
ours is offered there, then ours, nothing here to change): the ``kernel`` column names
the output code's kernel for the timed pass. ``triton``: the same without CUTEDSL;
``triton-tuned``: under max-autotune (not by default); ``flash``: flex with ``BACKEND=
"FLASH"``, torch's lowering onto flash-attn 4's CuTe DSL kernels (the peer; by default
where ``flash_attn.cute`` imports, else a failed row naming the wheel; its ``kernel`` is
``flash`` where the pass's output code names flash-attn's kernels or torch's template);
``sdpa-flash``/``sdpa-cudnn`` and (not by default) ``sdpa-choice``: SDPA, causal only
(``attention_sdpa.py``).
Each first call compiles afresh (no FX graph or AOT autograd cache: the output code read
is the code compiled; our CuTe kernels may load from the kernel cache) with AOT autograd's
donated buffers off, so that ``bwd`` can time the backward alone,
``autograd.grad(out, (q, k, v), dout, retain_graph=True)``; ``fwd`` is one call under
no_grad. Timing: ``--rounds`` interleaved rounds of each variant (``--warmup`` calls, then
the median of ``--steps`` CUDA-event-timed ones); the median round counts, ours' ratios
keep their range over the rounds. FLOPs: 4 B H S^2 D times the mask's density, the
fraction of (q, kv) pairs kept, counted exactly element by element (``density``; the work
a kernel spends on dropped pairs of partial blocks is not counted); backward 2.5 times
that (FlashAttention's convention: five matmuls to the forward's two). ``--profile N``:
after the rounds, N calls of each variant under torch.profiler; the kernels each call
launches (memsets too: a zeroed workspace is part of the call), ms and launches per call,
printed under the row and written to attention_profile.csv.

Invariants: each variant's result (fwd: out; bwd: dq, dk, dv) is checked against
``triton``'s -- ``max_diff`` the largest absolute difference, ``ok`` finite and within
8 eps(dtype) of triton's largest magnitude (without a triton row: finite); each case
starts from ``torch._dynamo.reset()`` and frees its tensors at its end; a recompile while
timing is an error. Failure semantics: a variant that fails to build, compile (ours
refused: the reason), run, or whose output code lacks our kernel, and every variant of a
case that cannot be set up, gets a row with ``error`` and no figures; the run goes on.
The CSV is rewritten as each case ends; the exit status is 1 if any row failed or is
not ok.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import importlib.util
import math
import re
import statistics
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import torch

from .. import config
from ..compile import versions
from .args import (
    one_of,
    output_folder,
    parse_count,
    parse_rounds,
    parse_shard,
    parse_triples,
    positive,
)
from .attention_sdpa import CHOICE, sdpa_attention, sdpa_kernel_of
from .attention_sdpa import NAMES as SDPA_NAMES
from .attention_report import (
    HEADER,
    REFS,
    line,
    parse_csv_rows,
    summary,
    write_csv,
    write_plot,
    write_profile,
)
from .kernel_profile import kernel_events, per_call
from .timing import median_call_ms, tflops_and_ratios

SHAPES = [(8, 16, 2048), (4, 32, 8192), (1, 32, 32768)]
HEAD_DIMS = [64, 128]
QUICK = ([(8, 16, 2048)], [128])  # --quick: shapes, head dims (its help names them)
MASKS = ("causal", "sliding", "document", "alibi")
WINDOW = 1024  # sliding: keys per query
DOCUMENT = 1024  # document: mean document length
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
FLASH = "flash"  # flex's BACKEND="FLASH" (flash-attn 4)
VARIANTS = ("ours", "triton", "triton-tuned", FLASH, "sdpa-flash", "sdpa-cudnn", CHOICE)
DIRECTIONS = ("fwd", "bwd")
PROFILE_LINES = 6  # a profiled row's kernels printed under it
BACKWARD_FLOPS = 2.5  # times the forward's
OURS = "cutedsl_sm90_flex_attention"  # our forward's kernel names in the output code
REASON_CHARS = 400


@dataclasses.dataclass(frozen=True)
class Case:
    batch: int
    heads: int
    seq: int
    head_dim: int
    mask: str
    dtype: str


def causal(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
    return q_idx >= kv_idx


def sliding(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
    return (q_idx >= kv_idx) & (q_idx - kv_idx < WINDOW)


def document_ids(seq: int, device: Any) -> torch.Tensor:
    """Each position's document: the sequence cut at seq // DOCUMENT - 1 distinct random
    places (seed 0), ids counting up from 0."""
    places = torch.randperm(seq - 1, generator=torch.Generator().manual_seed(0))
    starts = torch.zeros(seq, dtype=torch.int32)
    starts[places[:max(seq // DOCUMENT - 1, 0)] + 1] = 1
    return starts.cumsum(0).to(torch.int32).to(device)


def mods(case: Case, device: Any) -> tuple[Callable | None, Callable]:
    """The case's (score_mod or None, mask_mod)."""
    if case.mask == "document":
        ids = document_ids(case.seq, device)

        def document(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
            return (ids[q_idx] == ids[kv_idx]) & (q_idx >= kv_idx)
        return None, document
    if case.mask == "alibi":
        slopes = torch.exp2(-8.0 * torch.arange(1, case.heads + 1, device=device) / case.heads)

        def alibi(score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
            return score + slopes[h] * (kv_idx - q_idx)
        return alibi, causal
    return None, {"causal": causal, "sliding": sliding}[case.mask]


def density(mask_mod: Callable, seq: int, device: Any = "cpu", chunk: int = 1 << 24) -> float:
    """The fraction of the seq x seq (q, kv) pairs ``mask_mod`` keeps, counted exactly:
    evaluated on every pair, rows at a time (about ``chunk`` pairs each), at b = h = 0
    (no mask here depends on the batch or head)."""
    kv = torch.arange(seq, device=device)[None, :]
    zero = torch.zeros((), dtype=torch.int64, device=device)
    rows = max(1, chunk // seq)
    kept = sum(int(mask_mod(zero, zero, torch.arange(start, min(seq, start + rows),
                                                     device=device)[:, None], kv).sum())
               for start in range(0, seq, rows))
    return kept / seq ** 2


def flops(case: Case, kept: float, direction: str) -> float:
    forward = 4 * case.batch * case.heads * case.seq ** 2 * case.head_dim * kept
    return forward * (BACKWARD_FLOPS if direction == "bwd" else 1.0)


def variants_of(case: Case, asked: list[str]) -> list[str]:
    """The asked variants that run on ``case`` (SDPA's on plain causal only)."""
    return [name for name in asked if name not in SDPA_NAMES or case.mask == "causal"]


def flash_installed() -> bool:
    """Whether flash-attn 4's CuTe DSL package (``flash_attn.cute``) imports here."""
    try:
        return importlib.util.find_spec("flash_attn.cute") is not None
    except ImportError:  # a flash_attn without the cute subpackage, or a broken one
        return False


def default_variants() -> list[str]:
    return ["ours", "triton", *([FLASH] if flash_installed() else []), "sdpa-flash",
            "sdpa-cudnn"]


def attention(name: str, score_mod: Callable | None, block_mask: Any) -> Callable:
    """Variant ``name`` as a function of (q, k, v) -> out (see the module docstring)."""
    if name in SDPA_NAMES:
        return sdpa_attention(name)
    from torch.nn.attention.flex_attention import flex_attention

    if name == FLASH and not flash_installed():
        def missing(q: Any, k: Any, v: Any) -> Any:  # the first call's error: the row's
            raise RuntimeError("flash_attn.cute does not import: install the flash-attn-4 "
                               "wheel (with quack-kernels, einops, torch-c-dlpack-ext)")
        return missing
    options = ({"BACKEND": "FLASH"} if name == FLASH else
               {"BACKEND": "TRITON", **({"CUTEDSL": True} if name == "ours" else {})})
    compiled = torch.compile(flex_attention, dynamic=False,
                             mode="max-autotune-no-cudagraphs" if name == "triton-tuned" else None)

    def flex(q: Any, k: Any, v: Any) -> Any:
        return compiled(q, k, v, score_mod=score_mod, block_mask=block_mask,
                        kernel_options=options)
    return flex


@contextlib.contextmanager
def _compiling(name: str) -> Iterator[list[str]]:
    """What a variant's first call compiles under (ours alone, or none of ours; donated
    buffers off; no FX graph or AOT autograd cache, so that every graph is compiled and
    its output code seen), collecting that code graph by graph, in order."""
    from torch._functorch import config as functorch_config
    from torch._inductor import config as inductor_config
    from torch._inductor.graph import GraphLowering

    codes: list[str] = []
    # the SDPA choice set applies where CUTEDSL is listed (config.sdpa)
    listed = {"max_autotune_gemm_backends": "ATEN,TRITON,CUTEDSL"} if name == CHOICE else {}
    with config.patch(flex_attention=False, flex_only_ours=name == "ours",
                      sdpa=name == CHOICE), \
            functorch_config.patch(donated_buffer=False, enable_autograd_cache=False), \
            inductor_config.patch(fx_graph_cache=False, **listed), \
            mock.patch.object(GraphLowering, "save_output_code", codes.append):
        yield codes


def _kernel(name: str, codes: list[str], direction: str) -> str:
    """What ran the timed pass: SDPA's backend, or the attention kernel of the output code
    (the backward graph's for bwd); RuntimeError where ours is not the forward's."""
    if name in SDPA_NAMES:
        return sdpa_kernel_of(name, codes, direction)
    if len(codes) < (2 if direction == "bwd" else 1):
        raise RuntimeError(f"torch.compile made {len(codes)} graph(s) of output code")
    if name == "ours" and OURS not in codes[0]:
        raise RuntimeError(f"{OURS} is not in the forward's output code (this flex lowering "
                           "does not reach the Triton template)")
    code = codes[0] if direction == "fwd" else codes[-1]
    if name == FLASH and re.search(r"flash_attn|flash_attention", code):
        return FLASH
    if re.search(r"^cutedsl_\w*flex\w* = load_kernel\(", code, re.M):
        return "cutedsl"
    return "triton" if "triton" in code else "cpp"


def first_call(name: str, attend: Callable, inputs: list[torch.Tensor], direction: str
               ) -> tuple[Callable, list[torch.Tensor], str]:
    """Compile and run variant ``name`` once: (the call to time, its result, its kernel)."""
    q, k, v, dout = inputs
    with _compiling(name) as codes:
        if direction == "fwd":
            def call() -> Any:
                with torch.no_grad():
                    return attend(q, k, v)
            result = [call()]
        else:
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            out = attend(*leaves)

            def call() -> Any:
                return torch.autograd.grad(out, leaves, dout, retain_graph=True)
            result = list(call())
    return call, result, _kernel(name, codes, direction)


def reason(err: BaseException) -> str:
    """The innermost cause of ``err``, on one line."""
    while err.__cause__ is not None:
        err = err.__cause__
    return " ".join(f"{type(err).__name__}: {err}".split())[:REASON_CHARS]


def _check(result: list[torch.Tensor], reference: list[torch.Tensor] | None
           ) -> tuple[float, bool]:
    """(max abs difference to ``reference``, ok) -- see the module docstring."""
    finite = all(bool(t.isfinite().all()) for t in result)
    if reference is None:
        return math.nan, finite
    diff = max(float((t.float() - r.float()).abs().max()) for t, r in zip(result, reference))
    scale = max(float(r.float().abs().max()) for r in reference)
    return diff, finite and diff <= 8 * torch.finfo(result[0].dtype).eps * scale


def _row(case: Case, direction: str, name: str, kept: float, error: str) -> dict[str, Any]:
    return {**dataclasses.asdict(case), "direction": direction, "variant": name,
            "density": kept, "error": error, "ok": False}


def measure(case: Case, direction: str, names: list[str], attends: dict[str, Callable],
            inputs: list[torch.Tensor], kept: float, steps: int, warmup: int, rounds: int,
            profile: int = 0) -> list[dict[str, Any]]:
    """The rows of one case in one direction, a row per variant in ``names``; with
    ``profile`` calls under torch.profiler after the rounds, each row's ``kernels``."""
    calls, results, kernels, errors = {}, {}, {}, {}
    for name in names:
        try:
            calls[name], results[name], kernels[name] = first_call(name, attends[name], inputs,
                                                                   direction)
        except Exception as err:  # the variant's row says why; the others go on
            errors[name] = reason(err)
    times: dict[str, list[float]] = {name: [] for name in calls}
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(rounds):
            for name in list(calls):
                try:
                    times[name].append(median_call_ms(calls[name], steps, warmup,
                                                      cuda=inputs[0].is_cuda))
                except Exception as err:
                    errors[name] = reason(err)
                    del calls[name], times[name]
    profiled = {name: per_call(kernel_events(call, profile, memsets=True), profile)
                for name, call in calls.items()} if profile else {}
    refs = tuple(ref for ref in REFS if ref in times)
    rates = {subject: tflops_and_ratios(times, flops(case, kept, direction),
                                        refs if subject in times else (), subject)
             for subject in ("ours", CHOICE)}  # each over SDPA's and Triton's
    rows = []
    for name in names:
        row = _row(case, direction, name, kept, errors.get(name, ""))
        if name in times:
            diff, ok = _check(results[name], results.get("triton"))
            row.update(kernel=kernels[name], ms=statistics.median(times[name]),
                       tflops=rates["ours"][name], max_diff=diff, ok=ok)
            if name in rates:
                row.update({key: value for key, value in rates[name].items()
                            if key.startswith("vs_")})
            if name in profiled:
                row["kernels"] = profiled[name]
        rows.append(row)
    return rows


def setup(device: str) -> dict[str, str]:
    """The GPU and versions measured on (the CSV's setup columns)."""
    return dict(gpu=torch.cuda.get_device_name() if device == "cuda" else device,
                torch=torch.__version__,
                cute_dsl=versions.toolchain_versions()["nvidia-cutlass-dsl"])


def _case_rows(case: Case, args: argparse.Namespace, device: str) -> list[dict[str, Any]]:
    from torch.nn.attention.flex_attention import create_block_mask

    torch.manual_seed(0)
    shape = (case.batch, case.heads, case.seq, case.head_dim)
    inputs = [torch.randn(shape, device=device, dtype=DTYPES[case.dtype]) for _ in range(4)]
    score_mod, mask_mod = mods(case, device)
    kept = density(mask_mod, case.seq, device)
    block_mask = create_block_mask(mask_mod, None, None, case.seq, case.seq, device=device)
    names = variants_of(case, args.variants)
    attends = {name: attention(name, score_mod, block_mask) for name in names}
    return [row for direction in args.directions
            for row in measure(case, direction, names, attends, inputs, kept, args.steps,
                               args.warmup, args.rounds, args.profile)]


def measure_case(case: Case, args: argparse.Namespace, device: str) -> list[dict[str, Any]]:
    """Every direction and variant of ``case``, from fresh Dynamo caches, its memory freed
    at the end; where the case cannot be set up (out of memory, say), a failed row per
    direction and variant."""
    torch._dynamo.reset()
    try:
        rows = _case_rows(case, args, device)
    except Exception as err:  # the case's rows say why; the next case goes on
        rows = [_row(case, direction, name, math.nan, reason(err))
                for direction in args.directions for name in variants_of(case, args.variants)]
    torch._dynamo.reset()
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return [{**row, **setup(device)} for row in rows]


def cases_of(args: argparse.Namespace) -> list[Case]:
    shapes = args.shapes or (QUICK[0] if args.quick else SHAPES)
    head_dims = args.head_dims or (QUICK[1] if args.quick else HEAD_DIMS)
    index, count = args.shard
    return [Case(b, h, s, d, mask, dtype) for b, h, s in shapes for d in head_dims
            for mask in args.masks for dtype in args.dtypes][index - 1::count]


def run(args: argparse.Namespace, device: str = "cuda") -> list[dict[str, Any]]:
    """Every case of ``args``, printed and written to the CSV as each case ends."""
    rows: list[dict[str, Any]] = []
    print(HEADER, flush=True)
    for case in cases_of(args):
        for row in measure_case(case, args, device):
            rows.append(row)
            print(line(row), flush=True)
            for kernel in row.get("kernels", [])[:PROFILE_LINES]:
                print(f"    {kernel.ms:9.3f} ms {kernel.launches:4.1f}x  {kernel.name[:100]}")
        write_csv(rows, args.out / "attention_bench.csv")
        if args.profile:
            write_profile(rows, args.out / "attention_profile.csv")
    return rows


def _head_dims(text: str) -> list[int]:
    return [positive("head dim")(item) for item in text.split(",")]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true",
                   help="shape 8x16x2048, head dim 128 (unless given)")
    p.add_argument("--shapes", type=parse_triples("BxHxS"), metavar="BxHxS,...",
                   help="batch x heads x sequence (default: 8x16x2048,4x32x8192,1x32x32768)")
    p.add_argument("--head-dims", type=_head_dims, metavar="64,128", help="default 64,128")
    p.add_argument("--masks", type=one_of(MASKS, "mask", all_of=True), default=list(MASKS),
                   metavar=",".join(MASKS))
    p.add_argument("--dtypes", type=one_of(tuple(DTYPES), "dtype"), default=["bf16"],
                   metavar="bf16,fp16", help="default bf16")
    p.add_argument("--variants", type=one_of(VARIANTS, "variant", all_of=True),
                   default=default_variants(), metavar=",".join(VARIANTS),
                   help="default ours,triton,flash (where flash-attn 4 is installed),"
                        "sdpa-flash,sdpa-cudnn")
    p.add_argument("--directions", type=one_of(DIRECTIONS, "direction"),
                   default=list(DIRECTIONS), metavar="fwd,bwd")
    p.add_argument("--steps", type=parse_count, default=10, help="timed calls per round")
    p.add_argument("--warmup", type=parse_count, default=3, help="untimed calls per round")
    p.add_argument("--rounds", type=parse_rounds, default=3,
                   help="interleaved rounds per case (their median counts)")
    p.add_argument("--profile", type=parse_count, default=0, metavar="N",
                   help="also run N calls of each variant under torch.profiler: its kernels' "
                        "ms and launches per call (printed, and attention_profile.csv)")
    p.add_argument("--shard", type=parse_shard, default=(1, 1), metavar="K/N",
                   help="run every N-th case starting at the K-th (one run per GPU)")
    p.add_argument("--out", type=output_folder, default=Path("bench-out"),
                   help="folder for attention_bench.csv and attention_bench.png")
    p.add_argument("--merge", type=parse_csv_rows, nargs="+", metavar="DIR|CSV",
                   help="print and plot runs made earlier (their folders or CSV files)")


def main(args: argparse.Namespace) -> int:
    if args.merge:
        rows = [row for run_rows in args.merge for row in run_rows]
        print("\n".join([HEADER] + [line(row) for row in rows]))
        write_csv(rows, args.out / "attention_bench.csv")
    elif not torch.cuda.is_available():
        print("bench attention needs a GPU")
        return 2
    else:
        rows = run(args)
    print(summary(rows))
    write_plot(rows, args.out / "attention_bench.png")
    print(f"wrote {args.out / 'attention_bench.csv'} and {args.out / 'attention_bench.png'}")
    return 0 if all(row["ok"] for row in rows) else 1
