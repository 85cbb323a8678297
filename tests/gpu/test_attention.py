"""Our FlexAttention forward and backward on an sm_90 GPU, through torch.compile(flex_attention) with
``kernel_options={"CUTEDSL": True}``: out and LSE against a float64 reference on fresh
random inputs, for no mask, causal, sliding window, document masking, ALiBi, tanh
soft-capping and a relative bias from a captured tensor; sequence lengths that are no
tile multiples, Q_LEN != KV_LEN, GQA, bf16/fp16, head dims 64/128, each of the offered
KV tiles, the persistent forward (``flex_persistent``) with more tiles than SMs, the
folded scale (``flex_fold_scale``); outputs NaN-poisoned (the allocator's free memory is
filled with NaN before the call, so unwritten elements show). Inductor's name filter keeps only our choices,
so what is checked is our kernel (asserted in the output code)."""

import functools
import math

import pytest
import torch

from cutedsl_inductor import config
from cutedsl_inductor.kernels.attention import template as flex_template

pytestmark = pytest.mark.gpu

OURS = "cutedsl_sm90_flex_attention"
OUT_TOLERANCE = 1e-2  # relative Frobenius error of a 16-bit output
LSE_TOLERANCE = 2e-3  # absolute, natural log


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def sliding_window(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) & (q_idx - kv_idx <= 100)


def soft_cap(score, b, h, q_idx, kv_idx):
    return 30.0 * torch.tanh(score / 30.0)


def make_alibi(heads):
    slopes = torch.exp2(-8.0 * torch.arange(1, heads + 1, device="cuda") / heads)

    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)
    return alibi


def make_relative_bias(heads, q_len, kv_len):
    bias = torch.randn(heads, q_len + kv_len - 1, device="cuda")

    def relative_bias(score, b, h, q_idx, kv_idx):
        return score + bias[h, q_idx - kv_idx + kv_len - 1]
    return relative_bias


def make_document(length):
    # documents of random lengths (ids ascending), the mask causal within a document
    cuts = torch.sort(torch.randint(1, length, (5,), device="cuda")).values
    ids = torch.bucketize(torch.arange(length, device="cuda"), cuts, right=True).int()

    def document(b, h, q_idx, kv_idx):
        return (ids[q_idx] == ids[kv_idx]) & (q_idx >= kv_idx)
    return document


def reference(q, k, v, scale, score_mod, mask_mod):
    """float64 out and natural-log LSE, the mods applied on broadcast index grids."""
    batch, heads, q_len, _ = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    k = k.double().repeat_interleave(heads // kv_heads, dim=1)
    v = v.double().repeat_interleave(heads // kv_heads, dim=1)
    scores = (q.double() @ k.transpose(-1, -2)) * scale
    idx = [torch.arange(n, device="cuda").view(*([1] * i), n, *([1] * (3 - i)))
           for i, n in enumerate((batch, heads, q_len, kv_len))]
    if score_mod is not None:
        scores = score_mod(scores, *idx).double()
    if mask_mod is not None:
        keep = torch.broadcast_to(mask_mod(*idx), scores.shape)
        scores = scores.masked_fill(~keep, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    return torch.softmax(scores, dim=-1) @ v, lse


def poison_free_memory():
    """Fill the caching allocator's free blocks with NaN: outputs allocated next start as
    NaN, so an element the kernel does not write shows."""
    torch.cuda.synchronize()
    free = torch.cuda.mem_get_info()[0]
    blob = torch.full((min(free // 8, 1 << 28),), float("nan"), device="cuda")
    del blob


@functools.cache
def compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention
    return torch.compile(flex_attention, dynamic=False)


def run_ours(q, k, v, score_mod, block_mask, monkeypatch, block_n=None):
    """(out, lse, output code) of flex_attention with only our choices."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    if block_n is not None:
        real = flex_template.default_configs
        monkeypatch.setattr(flex_template, "default_configs", lambda *a: [
            c for c in real(*a) if c.block_n == block_n])
    with torch._inductor.config.patch({"test_configs.autotune_choice_name_regex": OURS}), \
            config.patch(flex_max_configs=1):
        poison_free_memory()
        (out, lse), codes = run_and_get_code(
            compiled_flex(), q, k, v, score_mod=score_mod, block_mask=block_mask,
            return_lse=True, enable_gqa=q.shape[1] != k.shape[1],
            kernel_options={"CUTEDSL": True, "BACKEND": "TRITON"})  # no flex decoding
    return out, lse, "\n".join(codes)


def check(q_len, kv_len, monkeypatch, *, heads=4, kv_heads=4, batch=2, head_dim=64,
          dtype=torch.bfloat16, score_mod=None, mask_mod=None, block_n=None,
          mask_per_head=False):
    from torch.nn.attention.flex_attention import create_block_mask

    torch.manual_seed(q_len * 7 + kv_len)
    q = torch.randn(batch, heads, q_len, head_dim, device="cuda", dtype=dtype)
    k = torch.randn(batch, kv_heads, kv_len, head_dim, device="cuda", dtype=dtype)
    v = torch.randn(batch, kv_heads, kv_len, head_dim, device="cuda", dtype=dtype)
    block_mask = None
    if mask_mod is not None:
        block_mask = create_block_mask(mask_mod, batch if mask_per_head else None,
                                       heads if mask_per_head else None, q_len, kv_len,
                                       device="cuda")
    out, lse, code = run_ours(q, k, v, score_mod, block_mask, monkeypatch, block_n)
    assert OURS in code, "our kernel is not in the output code"
    ref_out, ref_lse = reference(q, k, v, 1.0 / math.sqrt(head_dim), score_mod, mask_mod)
    assert out.dtype == dtype and out.shape == ref_out.shape
    assert not torch.isnan(out).any(), "NaN in out"
    assert not torch.isnan(lse).any(), "NaN in the LSE"
    error = ((out.double() - ref_out).norm() / ref_out.norm()).item()
    assert error < OUT_TOLERANCE, f"out: relative error {error}"
    lse_error = (lse.double() - ref_lse).abs().max().item()
    assert lse_error < LSE_TOLERANCE, f"LSE: max abs error {lse_error}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("block_n", [128, 64])
@pytest.mark.parametrize("q_len, kv_len", [(256, 256), (200, 200), (1000, 1000),
                                           (100, 300), (333, 77)])
def test_no_mask(monkeypatch, dtype, head_dim, block_n, q_len, kv_len):
    check(q_len, kv_len, monkeypatch, dtype=dtype, head_dim=head_dim, block_n=block_n)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("q_len", [128, 300, 1029])
@pytest.mark.parametrize("mask_per_head", [False, True])
def test_causal(monkeypatch, head_dim, q_len, mask_per_head):
    check(q_len, q_len, monkeypatch, head_dim=head_dim, mask_mod=causal,
          mask_per_head=mask_per_head)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("mask_mod", [None, causal])
def test_the_serial_mainloop(monkeypatch, head_dim, mask_mod):
    """``config.flex_pipelined`` off: each GEMM waited for at once, no softmax overlap."""
    with config.patch(flex_pipelined=False):
        check(1000, 1000, monkeypatch, head_dim=head_dim, mask_mod=mask_mod)


def document_or(mask_mod, q_len, kv_len):
    """``mask_mod``, or for "document" a document mask over ``q_len`` (skipped where the
    lengths differ: document ids index queries and keys alike)."""
    if mask_mod != "document":
        return mask_mod
    if q_len != kv_len:
        pytest.skip("document ids index queries and keys alike")
    return make_document(q_len)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("mask_mod", [None, causal, "document"])
@pytest.mark.parametrize("q_len, kv_len", [(1000, 1000), (333, 77), (64, 700)])
@pytest.mark.parametrize("pingpong", [True, False])
def test_pingpong_turns(monkeypatch, head_dim, mask_mod, q_len, kv_len, pingpong):
    """``config.flex_pingpong`` on (the default): the warpgroups take turns issuing their
    GEMMs (a turn missed or doubled hangs the CTA; one KV tile, several, a tile only half
    full); off: their GEMMs interleave as the schedulers take them."""
    mask_mod = document_or(mask_mod, q_len, kv_len)
    with config.patch(flex_pingpong=pingpong):
        check(q_len, kv_len, monkeypatch, head_dim=head_dim, mask_mod=mask_mod)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("mask_mod", [None, causal, "document"])
@pytest.mark.parametrize("q_len, kv_len", [(1000, 1000), (333, 77)])
def test_the_folded_scale(monkeypatch, head_dim, mask_mod, q_len, kv_len):
    """``config.flex_fold_scale`` on: the row max over the raw scores, sm_scale log2e in
    the exp2's FFMA (masked and out-of-range scores stay -inf, a tile only half full)."""
    mask_mod = document_or(mask_mod, q_len, kv_len)
    with config.patch(flex_fold_scale=True):
        check(q_len, kv_len, monkeypatch, head_dim=head_dim, mask_mod=mask_mod)


@pytest.mark.parametrize("q_len", [512, 777])
def test_sliding_window(monkeypatch, q_len):
    check(q_len, q_len, monkeypatch, mask_mod=sliding_window, dtype=torch.float16)


@pytest.mark.parametrize("q_len", [640, 999])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_document_mask(monkeypatch, q_len, head_dim):
    check(q_len, q_len, monkeypatch, head_dim=head_dim, mask_mod=make_document(q_len))


@pytest.mark.parametrize("q_len, kv_len", [(384, 384), (250, 410)])
def test_alibi(monkeypatch, q_len, kv_len):
    check(q_len, kv_len, monkeypatch, score_mod=make_alibi(4))


@pytest.mark.parametrize("head_dim", [64, 128])
def test_tanh_soft_capping_with_causal(monkeypatch, head_dim):
    check(500, 500, monkeypatch, head_dim=head_dim, score_mod=soft_cap, mask_mod=causal)


def test_relative_bias_from_a_captured_tensor(monkeypatch):
    check(300, 260, monkeypatch, score_mod=make_relative_bias(4, 300, 260))


@pytest.mark.parametrize("kv_heads", [1, 2])
@pytest.mark.parametrize("mask_mod", [None, causal])
def test_gqa(monkeypatch, kv_heads, mask_mod):
    check(333, 333, monkeypatch, heads=8, kv_heads=kv_heads, mask_mod=mask_mod,
          head_dim=128)


PERSISTENT_CASES = {  # (q_len, kv_len, kv_heads, mask_mod): 4 x 16 heads
    "causal": (1029, 1029, 16, causal), "sliding": (1029, 1029, 16, sliding_window),
    "document": (999, 999, 16, "document"), "no mask": (1000, 700, 16, None),
    "gqa causal": (1029, 1029, 4, causal)}


@pytest.mark.parametrize("case, mainloop, head_dim", [
    *((case, mainloop, 128) for case in PERSISTENT_CASES
      for mainloop in ("pingpong", "pipelined", "serial")),
    ("causal", "pingpong", 64), ("document", "pingpong", 64)])
def test_persistent(monkeypatch, case, mainloop, head_dim):
    """``config.flex_persistent``: 4 x 16 heads of 8-9 Q tiles, 4-5 a CTA, the odd rounds
    walked backwards (a Q buffer, ring slot or ping-pong turn mishandled between tiles hangs
    the CTA or mixes the tiles' rows), lengths that are no tile multiples."""
    q_len, kv_len, kv_heads, mask_mod = PERSISTENT_CASES[case]
    if mask_mod == "document":
        mask_mod = make_document(q_len)
    with config.patch(flex_persistent=True, flex_pipelined=mainloop != "serial",
                      flex_pingpong=mainloop == "pingpong"):
        check(q_len, kv_len, monkeypatch, batch=4, heads=16, kv_heads=kv_heads,
              head_dim=head_dim, mask_mod=mask_mod)


def test_switched_off_inductor_runs_its_own_kernel():
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    q = torch.randn(1, 2, 256, 64, device="cuda", dtype=torch.bfloat16)
    out, codes = run_and_get_code(compiled_flex(), q, q, q)
    assert OURS not in "\n".join(codes)
    assert not torch.isnan(out).any()


def test_autotuned_against_triton(monkeypatch):
    """Switched on without the name filter: ours and Triton's are timed, either may win,
    and the result is right."""
    from torch._inductor.utils import run_and_get_code
    from torch.nn.attention.flex_attention import create_block_mask

    torch._dynamo.reset()
    q, k, v = (torch.randn(2, 8, 1024, 128, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    block_mask = create_block_mask(causal, None, None, 1024, 1024, device="cuda")
    (out, lse), _ = run_and_get_code(compiled_flex(), q, k, v, block_mask=block_mask,
                                     return_lse=True, kernel_options={"CUTEDSL": True})
    ref_out, ref_lse = reference(q, k, v, 1.0 / math.sqrt(128), None, causal)
    assert ((out.double() - ref_out).norm() / ref_out.norm()).item() < OUT_TOLERANCE
    assert (lse.double() - ref_lse).abs().max().item() < LSE_TOLERANCE


# ---------------------------------------------------------------------------- backward
# Our FlexAttention backward through torch.compile: a training step (forward, then
# backward of a random grad_out) with kernel_options={"CUTEDSL": True}; dQ, dK, dV against
# float64 autograd of the reference. The name filter keeps only our choices in both
# lowerings (the backward's name extends the forward's), asserted in the output code.
# Small cases first: run with -x.

OURS_BWD = "cutedsl_sm90_flex_attention_bwd"
GRAD_TOLERANCE = 2e-2  # relative Frobenius error of a 16-bit gradient


def run_ours_backward(q, k, v, grad_out, score_mod, block_mask, fused=False):
    """(dq, dk, dv, output code) of a compiled flex_attention step with only our choices
    (tensors the score_mod captures that need gradients get theirs too); ``fused``: the
    backward in one kernel, dQ through atomics (``flex_bwd_fused_dq``)."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))

    def step():
        out = compiled_flex()(q, k, v, score_mod=score_mod, block_mask=block_mask,
                              enable_gqa=q.shape[1] != k.shape[1],
                              kernel_options={"CUTEDSL": True, "BACKEND": "TRITON"})
        out.backward(grad_out)
        return out

    with torch._inductor.config.patch({"test_configs.autotune_choice_name_regex": OURS}), \
            config.patch(flex_max_configs=1, flex_bwd_fused_dq=fused):
        poison_free_memory()
        _, codes = run_and_get_code(step)
    code = "\n".join(codes)
    assert f"FUSED_DQ: cutlass.Constexpr = {fused}" in code
    return q.grad, k.grad, v.grad, code


def backward_inputs(seed, batch, heads, kv_heads, q_len, kv_len, head_dim, dtype):
    """Fresh random q, k, v and grad_out."""
    torch.manual_seed(seed)
    q = torch.randn(batch, heads, q_len, head_dim, device="cuda", dtype=dtype)
    k = torch.randn(batch, kv_heads, kv_len, head_dim, device="cuda", dtype=dtype)
    v = torch.randn(batch, kv_heads, kv_len, head_dim, device="cuda", dtype=dtype)
    grad_out = torch.randn(batch, heads, q_len, head_dim, device="cuda", dtype=dtype)
    return q, k, v, grad_out


def assert_grads_close(grads, ref, dtype):
    """dq, dk, dv: in ``dtype``, ref's shapes, no NaN, within GRAD_TOLERANCE of float64."""
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref, strict=True):
        assert got.dtype == dtype and got.shape == want.shape, name
        assert not torch.isnan(got).any(), f"NaN in {name}"
        error = ((got.double() - want.grad).norm() / want.grad.norm()).item()
        assert error < GRAD_TOLERANCE, f"{name}: relative error {error}"


def check_backward(q_len, kv_len, *, heads=4, kv_heads=4, batch=2, head_dim=64,
                   dtype=torch.bfloat16, score_mod=None, mask_mod=None, mask_per_head=False,
                   fused=False):
    from torch.nn.attention.flex_attention import create_block_mask

    q, k, v, grad_out = backward_inputs(q_len * 11 + kv_len, batch, heads, kv_heads,
                                        q_len, kv_len, head_dim, dtype)
    block_mask = None
    if mask_mod is not None:
        block_mask = create_block_mask(mask_mod, batch if mask_per_head else None,
                                       heads if mask_per_head else None, q_len, kv_len,
                                       device="cuda")
    grads = run_ours_backward(q, k, v, grad_out, score_mod, block_mask, fused)
    assert OURS_BWD in grads[3], "our backward kernel is not in the output code"
    plain = f"PLAIN_SCORES: cutlass.Constexpr = {score_mod is None}"
    assert plain in grads[3], "plain scores (P in fp32, no exp2 for dS) without a score_mod"
    ref = [t.double().requires_grad_() for t in (q, k, v)]
    out, _ = reference(*ref, 1.0 / math.sqrt(head_dim), score_mod, mask_mod)
    out.backward(grad_out.double())
    assert_grads_close(grads[:3], ref, dtype)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("q_len, kv_len", [(128, 128), (256, 256), (200, 200), (100, 300),
                                           (333, 77), (1000, 1000)])
def test_backward_no_mask(q_len, kv_len, dtype, head_dim):
    check_backward(q_len, kv_len, dtype=dtype, head_dim=head_dim)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("q_len", [128, 300, 1029])
@pytest.mark.parametrize("mask_per_head", [False, True])
def test_backward_causal(head_dim, q_len, mask_per_head):
    check_backward(q_len, q_len, head_dim=head_dim, mask_mod=causal, mask_per_head=mask_per_head)


@pytest.mark.parametrize("q_len", [512, 777])
def test_backward_sliding_window(q_len):
    check_backward(q_len, q_len, mask_mod=sliding_window, dtype=torch.float16)


@pytest.mark.parametrize("q_len", [640, 999])
def test_backward_document_mask(q_len):
    check_backward(q_len, q_len, head_dim=128, mask_mod=make_document(q_len))


@pytest.mark.parametrize("q_len, kv_len", [(384, 384), (250, 410)])
def test_backward_alibi(q_len, kv_len):
    check_backward(q_len, kv_len, score_mod=make_alibi(4))


@pytest.mark.parametrize("head_dim", [64, 128])
def test_backward_tanh_soft_capping_with_causal(head_dim):
    check_backward(500, 500, head_dim=head_dim, score_mod=soft_cap, mask_mod=causal)


def test_backward_relative_bias_from_a_captured_tensor():
    check_backward(300, 260, score_mod=make_relative_bias(4, 300, 260))


@pytest.mark.parametrize("kv_heads", [1, 2])
@pytest.mark.parametrize("mask_mod", [None, causal])
def test_backward_gqa(kv_heads, mask_mod):
    check_backward(333, 333, heads=8, kv_heads=kv_heads, mask_mod=mask_mod, head_dim=128)


# The backward in one kernel (``flex_bwd_fused_dq``): dQ added by every KV tile's CTA
# into a zeroed fp32 workspace (the output code's, made per call), then cast. Each case
# is made when it runs (the document mask's cuts are CUDA tensors).
FUSED_CASES = {
    "no-mask-200": lambda: dict(q_len=200, kv_len=200),
    "no-mask-100x300-fp16": lambda: dict(q_len=100, kv_len=300, dtype=torch.float16),
    "no-mask-333x77-128": lambda: dict(q_len=333, kv_len=77, head_dim=128),
    "no-mask-1000-128": lambda: dict(q_len=1000, kv_len=1000, head_dim=128),
    "causal-1029": lambda: dict(q_len=1029, kv_len=1029, mask_mod=causal),
    "causal-300-128-per-head": lambda: dict(q_len=300, kv_len=300, head_dim=128,
                                            mask_mod=causal, mask_per_head=True),
    "document-999-128": lambda: dict(q_len=999, kv_len=999, head_dim=128,
                                     mask_mod=make_document(999)),
    "sliding-777-fp16": lambda: dict(q_len=777, kv_len=777, mask_mod=sliding_window,
                                     dtype=torch.float16),
    "alibi-250x410": lambda: dict(q_len=250, kv_len=410, score_mod=make_alibi(4)),
    "soft-cap-causal-500-128": lambda: dict(q_len=500, kv_len=500, head_dim=128,
                                            score_mod=soft_cap, mask_mod=causal),
    "gqa-2-causal-128": lambda: dict(q_len=333, kv_len=333, heads=8, kv_heads=2,
                                     head_dim=128, mask_mod=causal),
    "gqa-1": lambda: dict(q_len=333, kv_len=333, heads=8, kv_heads=1),
}


@pytest.mark.parametrize("case", list(FUSED_CASES))
def test_backward_fused_dq(case):
    check_backward(**FUSED_CASES[case](), fused=True)


@pytest.mark.parametrize("case", list(FUSED_CASES))
@pytest.mark.parametrize("knob", ["flex_bwd_lpt", "flex_bwd_early_s"])
def test_backward_dkdv_levers(case, knob):
    """The two-kernel backward with a dK/dV lever on (the longest-first CTA order; S^T
    issued before the last step's dV and dK are waited for), on the fused cases' shapes,
    masks and GQA walks."""
    with config.patch(**{knob: True}):
        check_backward(**FUSED_CASES[case]())


# Gradients of captured tensors: learnable tables whose gradients our dK/dV kernel adds
# atomically (fp32) into the buffers Inductor zeroes. Against a float64 run of the whole
# attention their error is what bf16's rounding of O leaves once their sums cancel: an
# ideal fp32 kernel, emulated on these shapes, is 2-3e-2 off for ALiBi slopes without a
# mask and about 1e-3 off for a relative bias. So a captured gradient is held to float64
# given what the backward reads: q, k, v, dO and our forward's O and LSE (which the
# forward tests hold to float64 on their own). There that emulation stays within 3e-5,
# and a missing or doubled contribution shows.
CAPTURED_GRAD_TOLERANCE = 2e-3  # relative Frobenius error against that float64 gradient


def learnable_relative_bias(bias, kv_len):
    def relative_bias(score, b, h, q_idx, kv_idx):
        return score + bias[h, q_idx - kv_idx + kv_len - 1]
    return relative_bias


def learnable_alibi(slopes):
    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)
    return alibi


def check_captured_grads(q_len, kv_len, make_mod, table, *, heads=4, kv_heads=4, batch=2,
                         head_dim=64, dtype=torch.bfloat16, mask_mod=None, fused=False):
    """dQ, dK, dV from our backward, which must be in the output code, against float64;
    the gradient of ``table`` (fp32, captured by ``make_mod(table)``) against float64
    given our forward's O and LSE (``captured_grad_given``)."""
    from torch.nn.attention.flex_attention import create_block_mask

    q, k, v, grad_out = backward_inputs(q_len * 13 + kv_len, batch, heads, kv_heads,
                                        q_len, kv_len, head_dim, dtype)
    block_mask = None
    if mask_mod is not None:
        block_mask = create_block_mask(mask_mod, None, None, q_len, kv_len, device="cuda")
    table = table.detach().requires_grad_()
    *grads, code = run_ours_backward(q, k, v, grad_out, make_mod(table), block_mask, fused)
    assert OURS_BWD in code, "our backward kernel is not in the output code"
    ref = [t.double().requires_grad_() for t in (q, k, v)]
    ref_table = table.detach().double().requires_grad_()
    out, _ = reference(*ref, 1.0 / math.sqrt(head_dim), make_mod(ref_table), mask_mod)
    out.backward(grad_out.double())
    assert_grads_close(grads, ref, dtype)
    assert table.grad is not None and table.grad.dtype == table.dtype
    assert not torch.isnan(table.grad).any(), "NaN in the captured tensor's gradient"
    with torch.no_grad():  # the forward alone: the same kernel and config, so the same O, LSE
        ours_out, ours_lse, _ = run_ours(q, k, v, make_mod(table.detach()), block_mask, None)
    want = captured_grad_given(q, k, v, ours_out, ours_lse, grad_out, make_mod, table,
                               mask_mod)
    error = ((table.grad.double() - want).norm() / want.norm()).item()
    full = ((table.grad.double() - ref_table.grad).norm() / ref_table.grad.norm()).item()
    assert error < CAPTURED_GRAD_TOLERANCE, \
        f"captured gradient: relative error {error} (against the full float64 run: {full})"


def captured_grad_given(q, k, v, out, lse, grad_out, make_mod, table, mask_mod):
    """The float64 gradient of ``table`` from q, k, v, dO and a forward's O and
    natural-log LSE, as a backward computes it: P = exp(score_mod(S) - LSE) where kept,
    dS = P (dP - rowsum(dO O)), then dS through score_mod to the table."""
    batch, heads, q_len, _ = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    k = k.double().repeat_interleave(heads // kv_heads, dim=1)
    v = v.double().repeat_interleave(heads // kv_heads, dim=1)
    idx = [torch.arange(n, device="cuda").view(*([1] * i), n, *([1] * (3 - i)))
           for i, n in enumerate((batch, heads, q_len, kv_len))]
    scores = (q.double() @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    grad_table = table.detach().double().requires_grad_()
    post = make_mod(grad_table)(scores, *idx).double()
    keep = torch.ones_like(post, dtype=torch.bool)
    if mask_mod is not None:
        keep = torch.broadcast_to(mask_mod(*idx), post.shape)
    p = torch.where(keep, torch.exp(post.detach() - lse.double()[..., None]), 0.0)
    delta = (grad_out.double() * out.double()).sum(-1, keepdim=True)
    post.backward(p * (grad_out.double() @ v.transpose(-1, -2) - delta))
    return grad_table.grad


@pytest.mark.parametrize("mask_mod", [None, causal])
@pytest.mark.parametrize("q_len, kv_len", [(256, 256), (300, 260), (333, 333)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_backward_learnable_relative_bias(q_len, kv_len, dtype, mask_mod):
    bias = 0.5 * torch.randn(4, q_len + kv_len - 1, device="cuda")
    check_captured_grads(q_len, kv_len, lambda t: learnable_relative_bias(t, kv_len), bias,
                         dtype=dtype, mask_mod=mask_mod)


@pytest.mark.parametrize("mask_mod", [None, causal])
@pytest.mark.parametrize("q_len, kv_len", [(256, 256), (250, 410)])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_backward_learnable_alibi_slopes(q_len, kv_len, head_dim, mask_mod):
    slopes = torch.exp2(-8.0 * torch.arange(1, 5, device="cuda") / 4)
    check_captured_grads(q_len, kv_len, learnable_alibi, slopes, head_dim=head_dim,
                         mask_mod=mask_mod)


@pytest.mark.parametrize("kv_heads", [1, 2])
@pytest.mark.parametrize("mask_mod", [None, causal])
def test_backward_learnable_tables_with_gqa(kv_heads, mask_mod):
    """Each Q head of a KV head's group adds its own elements once (the dK/dV kernel
    walks the group); per-Q-head tables."""
    bias = 0.5 * torch.randn(8, 333 + 333 - 1, device="cuda")
    check_captured_grads(333, 333, lambda t: learnable_relative_bias(t, 333), bias, heads=8,
                         kv_heads=kv_heads, head_dim=128, mask_mod=mask_mod)
    slopes = torch.exp2(-8.0 * torch.arange(1, 9, device="cuda") / 8)
    check_captured_grads(333, 333, learnable_alibi, slopes, heads=8, kv_heads=kv_heads,
                         mask_mod=mask_mod)


@pytest.mark.parametrize("mask_mod", [None, causal])
def test_backward_fused_dq_with_a_learnable_table(mask_mod):
    bias = 0.5 * torch.randn(4, 300 + 260 - 1, device="cuda")
    check_captured_grads(300, 260, lambda t: learnable_relative_bias(t, 260), bias,
                         head_dim=128, mask_mod=mask_mod, fused=True)


def test_backward_an_untranslatable_captured_gradient_falls_back_to_triton(caplog):
    """A learnable bias through abs: its gradient needs sign, which our translator lacks;
    our backward refuses with a logged reason, Triton's runs, and the gradients are
    right."""
    import logging

    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    q, k, v = (torch.randn(1, 2, 256, 64, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))
    bias = torch.randn(2, device="cuda", requires_grad=True)

    def step():
        out = compiled_flex()(q, k, v, score_mod=lambda s, b, h, m, n: s + bias[h].abs(),
                              kernel_options={"CUTEDSL": True, "BACKEND": "TRITON"})
        out.sum().backward()

    # the refusal is logged while lowering: a cached graph (an earlier run's) would skip it
    with caplog.at_level(logging.WARNING, logger="cutedsl_inductor.inductor.flex"), \
            torch._inductor.config.patch(force_disable_caches=True):
        _, codes = run_and_get_code(step)
    assert OURS_BWD not in "\n".join(codes)
    assert any("op sign is not supported" in r.getMessage() for r in caplog.records)
    assert bias.grad is not None and not torch.isnan(q.grad).any()


def test_a_training_step_runs_our_backward_against_triton():
    """Switched on without the name filter, a small model's training step through
    flex_attention: ours and Triton's are timed in both lowerings, either may win, the
    step's gradient of the projection matches float64."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch._dynamo.reset()
    torch.manual_seed(0)
    proj = torch.nn.Linear(128, 3 * 128, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(2, 512, 128, device="cuda", dtype=torch.bfloat16)
    block_mask = create_block_mask(causal, None, None, 512, 512, device="cuda")

    def loss(x):
        q, k, v = proj(x).view(2, 512, 3, 2, 64).permute(2, 0, 3, 1, 4)
        out = flex_attention(q, k, v, block_mask=block_mask, kernel_options={"CUTEDSL": True})
        return out.float().pow(2).sum()

    torch.compile(loss, dynamic=False)(x).backward()
    weight = proj.weight.detach().double().requires_grad_()
    q, k, v = (x.double() @ weight.T + proj.bias.double()).view(2, 512, 3, 2, 64).permute(
        2, 0, 3, 1, 4)
    out, _ = reference(q, k, v, 1.0 / 8.0, None, causal)
    out.pow(2).sum().backward()
    error = ((proj.weight.grad.double() - weight.grad).norm() / weight.grad.norm()).item()
    assert error < 5e-2, f"the projection's gradient: relative error {error}"
