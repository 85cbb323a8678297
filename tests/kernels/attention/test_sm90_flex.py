"""The FlexAttention forward's mainloop structure in its PTX, compiled GPU-less for sm_90a:
pipelined, the next tile's S GEMM and the last tile's P V GEMM are both in flight
(``wait_group 1``) while the softmax's exp2s run, and O's wait (``wait_group 0``) comes
after them; serial, every GEMM is waited for at once. (ptxas could still move the wait
up in SASS: ``scores_step`` keeps the softmax out of the block the wait sits in, which
these PTX checks cannot see.)

Persistent (``FlexConfig.persistent``): the producer's and the consumers' grid-stride tile
loops, the producer's Q load behind a wait for Q's empty barrier inside its loop, the
consumers' release of Q's buffer, the ping-pong turns going on across tiles; compiled for
both head dims, causal and unmasked, its SASS with no stack frame (``cuobjdump
--dump-resource-usage``).

Folded scale (``FlexConfig.fold_scale``), in the SASS of the KV-tile loop (``nvdisasm``):
per KV tile and thread 64 FMULs fewer in each arm of the mask branch (no multiply by
sm_scale; the full tile of causal 8x16x2048: 564 instructions -> 500), as many ex2s and
GEMMs, no stack frame."""

import re
import subprocess

import cutlass
from cutlass import cute
import pytest
from cutlass.cute.runtime import make_fake_tensor
from cutlass.runtime import make_fake_stream

from cutedsl_inductor.kernels.attention.config import FlexConfig
from cutedsl_inductor.kernels.attention.sm90_flex import Sm90FlexAttention
from tests.helpers import cuobjdump, nvdisasm

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


def _ptx(cfg, directory, kernel=Causal):
    """The PTX of the causal kernel for ``cfg`` (bf16, B x H x S, one 128 block; its
    cubin beside it)."""
    directory.mkdir()
    q = _contiguous(cutlass.BFloat16, (B, H, S, cfg.head_dim))
    rows = _contiguous(cutlass.Float32, (B, H, S))
    num = _contiguous(cutlass.Int32, (B, H, S // 128))
    idx = _contiguous(cutlass.Int32, (B, H, S // 128, S // 128))
    cute.compile(kernel(cfg), q, q, q, q, rows, rows, num, idx, num, idx, (),
                 make_fake_stream(use_tvm_ffi_env_stream=True),
                 options=f"--enable-tvm-ffi --keep-ptx --keep-cubin --dump-dir={directory}")
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


def _persistent(head_dim=128, block_n=128, **fields):
    return FlexConfig(head_dim, block_n, 2, 128, 128, True, 0.125, persistent=True, **fields)


def _outermost_loop(ptx):
    """The body of the loop whose backward branch goes furthest back."""
    labels = {m.group(1): m.start() for m in re.finditer(r"^(\$L__BB\d+_\d+):", ptx, re.M)}
    branches = re.finditer(r"bra(?:\.uni)?\s+(\$L__BB\d+_\d+);", ptx)
    loops = [(labels[m.group(1)], m.end()) for m in branches
             if labels.get(m.group(1), len(ptx)) < m.start()]
    start, end = min(loops, key=lambda loop: loop[0] - loop[1])
    return ptx[start:end]


def _stack_and_registers(directory):
    tool = cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump is not installed (pip install nvidia-cuda-cuobjdump)")
    (cubin,) = directory.glob("*.cubin")
    usage = subprocess.run([tool, "--dump-resource-usage", str(cubin)], check=True,
                           capture_output=True, text=True).stdout
    ((regs, stack),) = re.findall(r"REG:(\d+) STACK:(\d+)", usage)
    return int(stack), int(regs)


@pytest.mark.parametrize("pingpong", [True, False])
def test_the_persistent_kernel_walks_tiles_and_refills_q_while_one_runs(tmp_path, pingpong):
    ptx = _ptx(_persistent(pingpong=pingpong), tmp_path / "persistent")
    producer = ptx[ptx.index("setmaxnreg.dec"):ptx.index("setmaxnreg.inc")]
    consumers = ptx[ptx.index("setmaxnreg.inc"):]
    # each role's outermost loop (tile += gridDim.x) holds a whole tile's work: the
    # producer's wait for Q's buffer (its empty barrier) before Q's TMA loads, then K's
    # and V's; the consumers' GEMMs and O's store
    producer_tile, consumer_tile = (_outermost_loop(role) for role in (producer, consumers))
    assert "%nctaid.x" in producer and "%nctaid.x" in consumers
    loads = "cp.async.bulk.tensor"
    assert producer_tile.index("mbarrier.try_wait") < producer_tile.index(loads)
    assert producer_tile.count(loads) == producer.count(loads)  # Q's too, not K's, V's alone
    assert "wgmma.mma_async" in consumer_tile and "st.global" in consumer_tile
    if pingpong:  # 2's arrive before the walk, 3 turns a tile, 1 takes 2's last pass after
        turns = re.compile(r"\bbar(?:rier)?\.(sync|arrive)(?:\.aligned)?\s+\S+,\s*256;")
        before, after = consumers.split(consumer_tile)
        assert [m.group(1) for m in turns.finditer(before)] == ["arrive"]
        assert [m.group(1) for m in turns.finditer(consumer_tile)] == ["sync", "arrive"] * 3
        assert [m.group(1) for m in turns.finditer(after)] == ["sync"]
    # the consumers release Q's buffer: one arrive site more than the non-persistent kernel
    plain = _ptx(FlexConfig(128, 128, 2, 128, 128, True, 0.125, pingpong=pingpong),
                 tmp_path / "plain")
    arrives = [len(re.findall(r"mbarrier\.arrive\.shared\.b64", text)) for text in (ptx, plain)]
    assert arrives[0] == arrives[1] + 1
    assert "%nctaid" not in plain


class Unmasked(Sm90FlexAttention):
    pass


@pytest.mark.parametrize("kernel", [Causal, Unmasked])
@pytest.mark.parametrize("head_dim, block_n, pipelined", [(128, 128, True), (64, 64, True),
                                                          (128, 128, False)])
def test_the_persistent_kernel_keeps_its_values_in_registers(tmp_path, kernel, head_dim,
                                                              block_n, pipelined):
    """No stack frame (no spills, no local memory) in the persistent kernel, as in the
    non-persistent one."""
    cfg = _persistent(head_dim, block_n, pipelined=pipelined, pingpong=pipelined)
    _ptx(cfg, tmp_path / "persistent", kernel)
    stack, regs = _stack_and_registers(tmp_path / "persistent")
    assert stack == 0, f"{stack} stack bytes ({regs} registers)"


def _loop_opcodes(tool, directory):
    """The opcodes of the consumers' KV-tile loop in the cubin's SASS (``tool``:
    nvdisasm): from the label its backward branch goes to, the first such branch after the
    S GEMM's wait with the P V GEMM still in flight (``WARPGROUP.DEPBAR.LE gsb0, 0x1``),
    to that branch."""
    (cubin,) = directory.glob("*.cubin")
    sass = subprocess.run([tool, "-c", str(cubin)], check=True, capture_output=True,
                          text=True).stdout
    lines = [re.sub(r"/\*.*?\*/", "", line).strip() for line in sass.splitlines()]
    lines = [line for line in lines if re.match(r"\.L_x_\d+:$|(@!?U?P\w+\s+)?[A-Z]", line)]
    labels = {line[:-1]: at for at, line in enumerate(lines) if line.startswith(".L_x_")}
    wait = next(at for at, line in enumerate(lines) if "DEPBAR.LE gsb0, 0x1" in line)
    for at in range(wait, len(lines)):
        target = re.search(r"BRA[^`]*`\((\.L_x_\d+)\)", lines[at])
        if target and labels[target.group(1)] < wait:
            body = lines[labels[target.group(1)] + 1:at + 1]
            return [re.sub(r"^@!?U?P\w+\s+", "", line).split()[0] for line in body
                    if not line.startswith(".L_x_")]
    raise AssertionError("no KV-tile loop after the S GEMM's wait")


def test_the_folded_scale_takes_one_fmul_per_score_out_of_the_loop(tmp_path):
    tool = nvdisasm()
    if tool is None:
        pytest.skip("nvdisasm is not installed (pip install nvidia-cuda-nvdisasm)")
    counts = {}
    for fold in (False, True):
        cfg = FlexConfig(128, 128, 2, 128, 128, True, 0.125, pingpong=True, fold_scale=fold)
        _ptx(cfg, tmp_path / f"fold_{fold}")
        ops = _loop_opcodes(tool, tmp_path / f"fold_{fold}")
        counts[fold] = {op: ops.count(op) for op in ("FMUL", "MUFU.EX2", "HGMMA")}
        counts[fold]["HGMMA"] = sum(op.startswith("HGMMA") for op in ops)
        assert _stack_and_registers(tmp_path / f"fold_{fold}")[0] == 0
    per_thread = 64 * 128 // 128  # S values a thread holds per KV tile
    # both arms of the mask branch (partial, full), each one FMUL a score fewer
    assert counts[False]["FMUL"] - counts[True]["FMUL"] == 2 * per_thread, counts
    # the same ex2s (a score's and a row's correction, both arms) and GEMMs (S, P V)
    assert counts[False]["MUFU.EX2"] == counts[True]["MUFU.EX2"] == 2 * (per_thread + 2)
    assert counts[False]["HGMMA"] == counts[True]["HGMMA"] == 16
