"""The FlexAttention forward's mainloop structure in its PTX, compiled GPU-less for sm_90a:
pipelined, the next tile's S GEMM and the last tile's P V GEMM are both in flight
(``wait_group 1``) while the softmax's exp2s run, and O's wait (``wait_group 0``) comes
after them; serial, every GEMM is waited for at once. (ptxas could still move the wait
up in SASS: ``scores_step`` keeps the softmax out of the block the wait sits in, which
these PTX checks cannot see.)"""

import re

import cutlass
from cutlass import cute
import pytest
from cutlass.cute.runtime import make_fake_tensor
from cutlass.runtime import make_fake_stream

from cutedsl_inductor.kernels.attention.config import FlexConfig
from cutedsl_inductor.kernels.attention.sm90_flex import Sm90FlexAttention

B, H, S = 2, 4, 1024
WAIT = re.compile(r"wgmma\.wait_group\.sync\.aligned\s+(\d+);")
# a WGMMA's operands after its accumulators: A from registers ({...}: O += P V) or from
# shared memory (a descriptor: S = Q K^T)
MMA = re.compile(r"wgmma\.mma_async\S*\s*\{[^}]*\},\s*(\{|%rd)")


def _gemms(ptx):
    return ["pv" if m.group(1) == "{" else "qk" for m in MMA.finditer(ptx)]


class Causal(Sm90FlexAttention):
    @cute.jit
    def mask_mod(self, b_idx, h_idx, q_idx, kv_idx, in_bounds, captures):
        return q_idx >= kv_idx


def _contiguous(dtype, shape):
    strides, step = [], 1
    for n in reversed(shape):
        strides.insert(0, step)
        step *= n
    return make_fake_tensor(dtype, shape, tuple(strides), assumed_align=16)


def _ptx(cfg, directory):
    """The PTX of the causal kernel for ``cfg`` (bf16, B x H x S, one 128 block)."""
    directory.mkdir()
    q = _contiguous(cutlass.BFloat16, (B, H, S, cfg.head_dim))
    rows = _contiguous(cutlass.Float32, (B, H, S))
    num = _contiguous(cutlass.Int32, (B, H, S // 128))
    idx = _contiguous(cutlass.Int32, (B, H, S // 128, S // 128))
    cute.compile(Causal(cfg), q, q, q, q, rows, rows, num, idx, num, idx, (),
                 make_fake_stream(use_tvm_ffi_env_stream=True),
                 options=f"--enable-tvm-ffi --keep-ptx --dump-dir={directory}")
    (ptx,) = directory.glob("*.ptx")
    return ptx.read_text()


def _config(pipelined, head_dim=128, block_n=128):
    return FlexConfig(head_dim, block_n, 2, 128, 128, True, 0.125, pipelined=pipelined)


@pytest.mark.parametrize("head_dim, block_n", [(128, 128), (64, 64)])
def test_the_softmax_runs_while_both_gemms_are_in_flight(tmp_path, head_dim, block_n):
    ptx = _ptx(_config(True, head_dim, block_n), tmp_path / "pipelined")
    waits = [(m.start(), int(m.group(1))) for m in WAIT.finditer(ptx)]
    # tile 0's S, the loop's S + P V, the last P V
    assert [n for _, n in waits] == [0, 1, 0, 0]
    prologue, one, zero, last = (at for at, _ in waits)
    issued = ptx[prologue:one]
    assert issued.count("wgmma.commit_group") == 2
    # S_t = Q K_t^T (k = head_dim), then O += P_{t-1} V_{t-1} (k = block_n)
    assert _gemms(issued) == ["qk"] * (head_dim // 16) + ["pv"] * (block_n // 16)
    # the whole softmax (both copies of scores_step's branch) between the two waits
    exps = ptx[one:zero].count("ex2.approx")
    assert exps == 2 * (block_n // 2 + 2)
    assert "ex2.approx" not in ptx[zero:last]


def test_the_serial_mainloop_waits_for_each_gemm(tmp_path):
    ptx = _ptx(_config(False), tmp_path / "serial")
    assert [int(n) for n in WAIT.findall(ptx)] == [0, 0]
    commits = [m.start() for m in re.finditer(r"wgmma\.commit_group", ptx)]
    waits = [m.start() for m in WAIT.finditer(ptx)]
    assert all(c < w for c, w in zip(commits, waits))


def test_pingpong_turns_hold_each_warpgroups_gemm_issue_and_pair_every_arrive(tmp_path):
    """Each turn: wait for it (bar.sync on the warpgroup's barrier, 256 threads), issue
    the turn's WGMMAs, pass it on (bar.arrive on the other's); no exp2 inside a turn.
    Warpgroup 2 arrives on 1's barrier once before the first turn and does not pass the
    last one: two arrives are predicated, so the PTX holds the turn structure, not its
    counts per warpgroup."""
    cfg = FlexConfig(128, 128, 2, 128, 128, True, 0.125, pipelined=True, pingpong=True)
    ptx = _ptx(cfg, tmp_path / "pingpong")
    bars = [(m.start(), m.group(1), m.group(2)) for m in re.finditer(
        r"\bbar(?:rier)?\.(sync|arrive)(?:\.aligned)?\s+(%r\d+|\d+),\s*256;", ptx)]
    syncs = [at for at, kind, _ in bars if kind == "sync"]
    assert len(syncs) == 3  # tile 0's S, the loop's S + P V, the last P V
    assert not re.search(r"\bbar(?:rier)?\.\w+(?:\.aligned)?\s+(%r\d+|\d+),\s*(?!256)\d+;",
                         ptx[syncs[0]:syncs[-1]])
    for at in syncs:  # each turn's WGMMAs lie between its wait and the next arrive
        following = [b for b, kind, _ in bars if kind == "arrive" and b > at]
        end = following[0] if following else len(ptx)
        turn = ptx[at:end]
        assert MMA.search(turn) and "ex2.approx" not in turn
    plain = _ptx(_config(True), tmp_path / "plain")  # its bar.syncs: barrier 0, all threads
    assert "bar.arrive" not in plain and not re.search(r"\bbar\.sync\s+%r\d+", plain)
