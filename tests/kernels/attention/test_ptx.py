"""The FlexAttention kernels' PTX, from real GPU-less compiles (``CUTE_DSL_KEEP=ptx,cubin``,
read when CuTe DSL is imported: a subprocess).

Captured reads: one load per row, column or CTA where the index depends on the query,
the key or the head alone, not one per element (the kernels hand the hooks in-range
indices and choose partial or full once per tile, so the rendered reads need no
per-element guard or branch); counted as ``ld.global``: with a guard or a branch per
element the forward's document mask had 264, its ALiBi 140, the backward's dK/dV and dQ
kernels 104 and 74 (dK/dV: 58 while each thread loaded its rows' LSE and delta itself,
before they were staged in shared memory once per warp).

The backward's dK/dV step, pipelined: S^T and dP^T in commit groups of their own, P^T
computed after ``wait_group 1`` (dP^T still running), dV's GEMM issued before dS^T is
computed after a second ``wait_group 1``; with plain scores (no score_mod) dS^T needs no
exp2 of its own. Serial (``flex_pipelined`` off): one wait for both, the two GEMMs after.

Longest first (``flex_bwd_lpt``): the dK/dV kernel's tile from a 1-D grid, its step
unchanged. Early S^T (``flex_bwd_early_s``): the step's S^T issued before the last step's
dV and dK are waited for, checked in the SASS too (``nvdisasm``).

Registers (the cubins' resource usage, by ``cuobjdump``): no stack frame."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import cuobjdump, nvdisasm

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = r"""
import torch, torch.fx
from torch._inductor.graph import GraphLowering
from torch._inductor.virtualized import V
from cutedsl_inductor import config
from cutedsl_inductor.kernels.attention.bwd_template import flex_bwd_choices
from cutedsl_inductor.kernels.attention.template import flex_choices
from tests.kernels.attention import test_bwd_template as bwd, test_template as fwd

runs = [("fwd", "document", True, False, ""), ("fwd", "alibi", True, False, ""),
        ("bwd", "document", True, False, ""), ("bwd", "alibi", True, False, ""),
        ("bwd", "causal", False, False, ""), ("bwd", "causal", True, True, ""),
        ("bwd", "causal", True, False, ""), ("bwd", "causal", True, False, "lpt"),
        ("bwd", "causal", True, False, "early")]
for direction, mods, pipelined, fused, knob in runs:
    with config.patch(disk_cache=False, flex_pipelined=pipelined, flex_bwd_fused_dq=fused,
                      flex_bwd_lpt=knob == "lpt", flex_bwd_early_s=knob == "early"), \
            V.set_graph_handler(GraphLowering(torch.fx.symbolic_trace(lambda x: x))):
        side, make = (fwd, flex_choices) if direction == "fwd" else (bwd, flex_bwd_choices)
        inputs = fwd.flex_inputs if direction == "fwd" else bwd.bwd_inputs
        nodes, layout, subgraphs = inputs(V.graph, torch.bfloat16, 128, side.MODS[mods])
        choices = []
        assert make(choices, nodes, layout, subgraphs, side.OPTIONS) is None
        choices[0].load()
        label = (f"{direction}-{mods}{'' if pipelined else '-serial'}{'-fused' if fused else ''}"
                 f"{'-' + knob if knob else ''}")
        print(label, choices[0].name)
"""

# the most ld.global each kernel may have (now: 76, 12, 30, 28)
BOUNDS = {("fwd-document", "flex_attention"): 100, ("fwd-alibi", "flex_attention"): 16,
          ("bwd-document", "dkdv"): 40, ("bwd-document", "dq"): 40}
WGMMA = re.compile(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)|(wgmma\.commit_group)|"
                   r"(wgmma\.mma_async)|(ex2\.approx)")


def _kernel(entry_name):
    for kernel in ("dq", "dkdv", "dkdvq", "cast"):
        if f"_{kernel}_" in entry_name:
            return kernel
    return "flex_attention"


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """({label: the choice's name}, the folder holding each choice's PTX and cubin)."""
    dump = tmp_path_factory.mktemp("ptx")
    env = {**os.environ, "CUTE_DSL_ARCH": "sm_90a", "CUTE_DSL_KEEP": "ptx,cubin",
           "CUTE_DSL_DUMP_DIR": str(dump), "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    choice_of = dict(line.split() for line in run.stdout.splitlines() if line.count(" ") == 1)
    return choice_of, dump


@pytest.fixture(scope="module")
def entries(compiled):
    """{(label, kernel): PTX of that entry} of the compiles SCRIPT runs."""
    choice_of, dump = compiled
    found = {}
    for label, name in choice_of.items():
        (ptx,) = dump.glob(f"cutlass_{name}_main_*.ptx")  # CuTe names it by the entry
        for entry in re.split(r"\.entry ", ptx.read_text())[1:]:
            found[label, _kernel(entry.split("(", 1)[0])] = entry
    return found


def test_captured_reads_are_shared_by_a_row_or_a_column(entries):
    loads = {key: len(re.findall(r"\bld\.global", entries[key])) for key in BOUNDS}
    over = {key: n for key, n in loads.items() if n > BOUNDS[key]}
    assert not over, f"ld.global per kernel {loads}, over the bounds {BOUNDS}"


def _order(ptx):
    """The WGMMA issues (M), commits (C), waits (W<n>) and exp2s (e), runs collapsed."""
    tokens = []
    for m in WGMMA.finditer(ptx):
        wait, commit, mma, _ = m.groups()
        token = f"W{wait}" if wait else "C" if commit else "M" if mma else "e"
        if not tokens or tokens[-1] != token:
            tokens.append(token)
    return " ".join(tokens)


def test_the_backward_overlaps_p_and_ds_with_its_gemms(entries):
    # a score_mod: P^T's exp2 while dP^T runs, the score's gradient's while dV's GEMM runs
    assert _order(entries["bwd-alibi", "dkdv"]) == "M C M C W1 e M C W1 e M C W0"
    # plain scores: P^T kept in fp32, dS^T = P^T (dP^T - delta) with no exp2 of its own
    assert _order(entries["bwd-document", "dkdv"]) == "M C M C W1 e M C W1 M C W0"
    assert _order(entries["bwd-causal-serial", "dkdv"]) == "M C W0 e M C W0"


def test_the_fused_dq_adds_each_half_of_a_step_with_tma_reduce_adds(entries):
    """Fused dQ: dS^T stored (stmatrix) and both halves in (a 256-thread barrier), dQ's
    GEMM issued, then dK's; once dQ's is in (``wait_group 1``) the warpgroup's half goes
    to shared memory while dK's runs, then in (128 threads) its TMA reduce-adds; the
    reduce-adds' reads are waited for before the next dS store. No per-thread reduction
    (``red.global``/``atom.global``: 4096 a step before)."""
    ptx = entries["bwd-causal-fused", "dkdvq"]
    steps = re.compile(r"(wgmma\.mma_async)|(wgmma\.wait_group\.sync\.aligned\s+(\d))|"
                       r"(stmatrix)|(bar\.sync\s+\S+,\s*(\d+))|(cp\.reduce\.async\.bulk\.tensor)|"
                       r"(cp\.async\.bulk\.wait_group\.read)")
    tokens = []
    for m in steps.finditer(ptx):
        mma, wait, pending, st, bar, threads, reduce, read = m.groups()
        token = ("M" if mma else f"W{pending}" if wait else "S" if st else f"B{threads}"
                 if bar else "R" if reduce else "r")
        if not tokens or tokens[-1] != token:
            tokens.append(token)
    assert " ".join(tokens).endswith("r S B256 M W1 B128 R W0"), tokens
    assert not re.search(r"\b(red|atom)\.global", ptx)


def test_the_longest_first_dkdv_kernel_reads_its_tile_from_a_1d_grid(entries):
    """``flex_bwd_lpt``: the dK/dV kernel's (KV tile, KV head, batch) come from
    ``%ctaid.x`` alone (``parts.longest_first``), its step is the plain one's; the dQ
    kernel keeps its 3-D grid."""
    ctaids = {key: {c: len(re.findall(rf"%ctaid\.{c}\b", entries[key])) for c in "xyz"}
              for key in [("bwd-causal", "dkdv"), ("bwd-causal-lpt", "dkdv"),
                          ("bwd-causal-lpt", "dq")]}
    assert ctaids["bwd-causal-lpt", "dkdv"]["y"] == ctaids["bwd-causal-lpt", "dkdv"]["z"] == 0
    assert ctaids["bwd-causal", "dkdv"]["y"] and ctaids["bwd-causal", "dkdv"]["z"], ctaids
    assert ctaids["bwd-causal-lpt", "dq"]["y"] and ctaids["bwd-causal-lpt", "dq"]["z"], ctaids
    assert _order(entries["bwd-causal-lpt", "dkdv"]) == _order(entries["bwd-causal", "dkdv"])


def _dkdv_gemms(tool, cubin):
    """The dK/dV kernel's HGMMAs and WGMMA waits in its SASS (``tool``: nvdisasm), as
    (text, shape, accumulator's first register, A's first register or None)."""
    sass = subprocess.run([tool, "-c", str(cubin)], check=True, capture_output=True,
                          text=True).stdout
    (dkdv,) = [part for part in re.split(r"\n\s*\.text\.", sass)
               if part.startswith("kernel_cutlass_kernel_dkdv")]
    found = re.finditer(r"HGMMA\.64x(\d+)x16\S* R(\d+), (?:R(\d+), )?gdesc|"
                        r"DEPBAR\.LE gsb0, 0x(\d)", dkdv)
    return [(f"W{m[4]}" if m[4] else f"M{m[1]}", int(m[2] or 0), m[3] and int(m[3]))
            for m in found]


def test_early_s_issues_the_next_s_gemm_while_dv_and_dk_run(compiled, entries):
    """``flex_bwd_early_s``: the step issues S^T, waits for the last step's dV and dK
    (``wait_group 1``) and releases their stage, then runs as before but for its end: no
    ``wait_group 0`` until the walk is done. In the SASS ptxas kept it (no waits of its
    own, no serialized WGMMAs): S^T's accumulator shares no register with the in-flight
    GEMMs' A operands (P^T, dS^T) or accumulators (dV, dK)."""
    assert _order(entries["bwd-causal-early", "dkdv"]) == "M C W1 M C W1 e M C W1 M C W0"
    assert _order(entries["bwd-causal", "dkdv"]) == "M C M C W1 e M C W1 M C W0"
    tool = nvdisasm()
    if tool is None:
        pytest.skip("nvdisasm is not installed (pip install nvidia-cuda-nvdisasm)")
    choice_of, dump = compiled
    (cubin,) = dump.glob(f"cutlass_{choice_of['bwd-causal-early']}_main_*.cubin")
    gemms = _dkdv_gemms(tool, cubin)
    tokens = []
    for kind, _, _ in gemms:
        if tokens and tokens[-1][0] == kind and kind != "W":
            tokens[-1] = (kind, tokens[-1][1] + 1)
        else:
            tokens.append((kind, 1))
    assert " ".join(f"{k}x{n}" if n > 1 else k for k, n in tokens) == (
        "M64x8 W1 M64x8 W1 M128x4 W1 M128x4 W0"), tokens
    s_acc = set(range(gemms[0][1], gemms[0][1] + 32))  # 64 x 64 fp32: 32 a thread
    for kind, acc, a in gemms:
        if kind == "M128":
            assert not s_acc & set(range(acc, acc + 64)), (gemms[0], acc)
            assert not s_acc & set(range(a, a + 4)), (gemms[0], a)


def test_the_backward_keeps_its_values_in_registers(compiled):
    """No stack frame in the head-dim-128 backward kernels: with a mask (document) and with
    a score_mod (ALiBi) the dK/dV consumer holds dK, dV, S^T, dP^T, P^T and dS^T in its 240
    registers, the rows' LSE and delta staged in shared memory (spilled before: a stack of
    208 and 312 bytes)."""
    tool = cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump is not installed (pip install nvidia-cuda-cuobjdump)")
    choice_of, dump = compiled
    stacks = {}
    for label in ("bwd-document", "bwd-alibi"):
        (cubin,) = dump.glob(f"cutlass_{choice_of[label]}_main_*.cubin")
        usage = subprocess.run([tool, "--dump-resource-usage", str(cubin)], check=True,
                               capture_output=True, text=True).stdout
        for name, stack in re.findall(r"Function (\S+):\s+REG:\d+ STACK:(\d+)", usage):
            stacks[label, _kernel(name)] = int(stack)
    assert len(stacks) == 4 and not any(stacks.values()), f"stack bytes per kernel: {stacks}"
