"""The FlexAttention kernels' PTX, from real GPU-less compiles (``CUTE_DSL_KEEP=ptx``,
read when CuTe DSL is imported: a subprocess).

Captured reads: one load per row, column or CTA where the index depends on the query,
the key or the head alone, not one per element (the kernels hand the hooks in-range
indices and choose partial or full once per tile, so the rendered reads need no
per-element guard or branch); counted as ``ld.global``: with a guard or a branch per
element the forward's document mask had 264, its ALiBi 140, the backward's dK/dV and dQ
kernels 104 and 74.

The backward's dK/dV step, pipelined: S^T and dP^T in commit groups of their own, P^T
computed after ``wait_group 1`` (dP^T still running), dV's GEMM issued before dS^T is
computed after a second ``wait_group 1``; serial (``flex_pipelined`` off): one wait for
both, the two GEMMs after."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = r"""
import torch, torch.fx
from torch._inductor.graph import GraphLowering
from torch._inductor.virtualized import V
from cutedsl_inductor import config
from cutedsl_inductor.kernels.attention.bwd_template import flex_bwd_choices
from cutedsl_inductor.kernels.attention.template import flex_choices
from tests.kernels.attention import test_bwd_template as bwd, test_template as fwd

runs = [("fwd", "document", True), ("fwd", "alibi", True), ("bwd", "document", True),
        ("bwd", "causal", False)]
for direction, mods, pipelined in runs:
    with config.patch(disk_cache=False, flex_pipelined=pipelined), \
            V.set_graph_handler(GraphLowering(torch.fx.symbolic_trace(lambda x: x))):
        side, make = (fwd, flex_choices) if direction == "fwd" else (bwd, flex_bwd_choices)
        inputs = fwd.flex_inputs if direction == "fwd" else bwd.bwd_inputs
        nodes, layout, subgraphs = inputs(V.graph, torch.bfloat16, 128, side.MODS[mods])
        choices = []
        assert make(choices, nodes, layout, subgraphs, side.OPTIONS) is None
        choices[0].load()
        print(f"{direction}-{mods}{'' if pipelined else '-serial'}", choices[0].name)
"""

# the most ld.global each kernel may have (now: 76, 12, 58, 28)
BOUNDS = {("fwd-document", "flex_attention"): 100, ("fwd-alibi", "flex_attention"): 16,
          ("bwd-document", "dkdv"): 70, ("bwd-document", "dq"): 40}
WGMMA = re.compile(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)|(wgmma\.commit_group)|"
                   r"(wgmma\.mma_async)|(ex2\.approx)")


@pytest.fixture(scope="module")
def entries(tmp_path_factory):
    """{(label, kernel): PTX of that entry} of the compiles SCRIPT runs."""
    dump = tmp_path_factory.mktemp("ptx")
    env = {**os.environ, "CUTE_DSL_ARCH": "sm_90a", "CUTE_DSL_KEEP": "ptx",
           "CUTE_DSL_DUMP_DIR": str(dump), "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    choice_of = dict(line.split() for line in run.stdout.splitlines() if line.count(" ") == 1)
    found = {}
    for label, name in choice_of.items():
        (ptx,) = dump.glob(f"cutlass_{name}_main_*.ptx")  # CuTe names it by the entry
        for entry in re.split(r"\.entry ", ptx.read_text())[1:]:
            entry_name = entry.split("(", 1)[0]
            kernel = ("dq" if "_dq_" in entry_name else "dkdv" if "_dkdv_" in entry_name
                      else "flex_attention")
            found[label, kernel] = entry
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
    assert _order(entries["bwd-document", "dkdv"]) == "M C M C W1 e M C W1 e M C W0"
    assert _order(entries["bwd-causal-serial", "dkdv"]) == "M C W0 e M C W0"
