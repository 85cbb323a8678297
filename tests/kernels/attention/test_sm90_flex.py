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
