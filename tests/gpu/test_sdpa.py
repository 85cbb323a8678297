"""``scaled_dot_product_attention`` in compiled graphs as an autotuning choice set
(``config.sdpa``, ``inductor/sdpa_pass.py``) on an sm_90 GPU: forward and backward of a
compiled SDPA call under max-autotune against float64 on fresh random inputs (lengths that
are no tile multiples, outputs NaN-poisoned) for causal, no mask, a boolean and an additive
mask broadcast over heads, GQA through ``enable_gqa`` and through repeated K and V. Inductor's
name filter picks the choice each autotuning keeps -- ours, each eligible ATen backend, and
a forward by one with the backward by another, which must agree on the saved logsumexp --
and the output code must show it ran. Then the choice set timed freely, the knob off, and a
two-layer Llama from transformers (``attn_implementation="sdpa"``) trained one step with our
attention forced and with the choice set free: loss and gradients within twice eager bf16's
error of an fp32 copy."""

import copy
import math
import re

import pytest
import torch
import torch.nn.functional as F

from cutedsl_inductor import config
from cutedsl_inductor.bench.attention_sdpa import sdpa_kernel_of
from tests.gpu.test_attention import GRAD_TOLERANCE, OUT_TOLERANCE, poison_free_memory

pytestmark = pytest.mark.gpu

OURS = "cutedsl_sm90_flex_attention"
CHECKS = {"flash": "can_use_flash_attention", "cudnn": "can_use_cudnn_attention",
          "efficient": "can_use_efficient_attention"}
SDPA_OP_PAIR = re.compile(r"aten\._scaled_dot_product_\w+\.default\(")  # a call, not a comment


def choice_filter(forward, backward):
    """Inductor's choice-name regex keeping ``forward``'s forward choice and
    ``backward``'s backward one ("ours" or an ATen backend)."""
    def one(who, is_backward):
        if who == "ours":
            return f"^{OURS}_bwd_" if is_backward else f"^{OURS}_(?!bwd_)"
        return f"^cutedsl_sdpa_{who}{'_backward' if is_backward else ''}$"
    return f"{one(forward, False)}|{one(backward, True)}"


def attention(q, k, v, mask, causal, gqa, repeat_kv):
    if repeat_kv:  # as transformers' repeat_kv
        b, kv_heads, length, d = k.shape
        k, v = (x.unsqueeze(2).expand(b, kv_heads, q.shape[1] // kv_heads, length, d)
                .reshape(b, q.shape[1], length, d) for x in (k, v))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                          enable_gqa=gqa)


def reference(q, k, v, mask, causal):
    """float64 SDPA (GQA by repeating K and V), q, k, v float64 leaves."""
    rep = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(rep, dim=1) for t in (k, v))
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = (scores.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool
                  else scores + mask.double())
    if causal:
        keep = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, -math.inf)
    return torch.softmax(scores, dim=-1) @ v


def make_inputs(length, head_dim, mask, heads=4, kv_heads=4, batch=2,
                dtype=torch.bfloat16):
    torch.manual_seed(length * 7 + head_dim)
    q, grad_out = (torch.randn(batch, heads, length, head_dim, device="cuda", dtype=dtype)
                   for _ in range(2))
    k, v = (torch.randn(batch, kv_heads, length, head_dim, device="cuda", dtype=dtype)
            for _ in range(2))
    made = None
    if mask == "bool":  # the diagonal kept: no row fully masked
        eye = torch.eye(length, dtype=torch.bool, device="cuda")
        made = (torch.rand(batch, 1, length, length, device="cuda") > 0.3) | eye
    elif mask == "additive":
        made = torch.randn(batch, 1, length, length, device="cuda", dtype=dtype)
    return q, k, v, made, grad_out


def eligible(backend, q, k, v, mask, causal, gqa):
    from torch.backends import cuda

    params = cuda.SDPAParams(q, k, v, mask, 0.0, causal, gqa)
    return getattr(cuda, CHECKS[backend])(params, False)


def compiled_step(q, k, v, mask, grad_out, causal, gqa=False, repeat_kv=False,
                  name_filter=None, sdpa=True):
    """(out, dq, dk, dv, the forward's and the backward's output code) of one compiled
    SDPA training step, the knob ``sdpa``."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    compiled = torch.compile(attention, mode="max-autotune-no-cudagraphs", dynamic=False)

    def step():
        out = compiled(*leaves, mask, causal, gqa, repeat_kv)
        out.backward(grad_out)
        return out

    # the choice set applies where CUTEDSL is listed
    with torch._inductor.config.patch({"test_configs.autotune_choice_name_regex": name_filter,
                                       "max_autotune_gemm_backends": "ATEN,TRITON,CUTEDSL"}), \
            config.patch(sdpa=sdpa, flex_max_configs=1):
        poison_free_memory()
        out, codes = run_and_get_code(step)
    assert len(codes) == 2, f"{len(codes)} graphs of output code"
    return (out, *(t.grad for t in leaves), *codes)


def check(q, k, v, mask, grad_out, causal, gqa=False, repeat_kv=False, forward=None,
          backward=None):
    """The compiled step against float64; ``forward`` / ``backward``: the choice each
    autotuning must keep and the output code must show ("ours" or an ATen backend),
    None: any."""
    name_filter = None if forward is None else choice_filter(forward, backward)
    out, *grads, fwd_code, bwd_code = compiled_step(q, k, v, mask, grad_out, causal, gqa,
                                                    repeat_kv, name_filter)
    ran = [sdpa_kernel_of("sdpa-choice", [fwd_code], "fwd"),
           sdpa_kernel_of("sdpa-choice", [bwd_code], "bwd")]
    if forward is not None:
        assert ran == [("cutedsl" if who == "ours" else who) for who in (forward, backward)]
    assert not SDPA_OP_PAIR.search(fwd_code + bwd_code), "SDPA's own op pair ran"
    ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref_out = reference(*ref, mask, causal)
    ref_out.backward(grad_out.double())
    for name, got, want in zip(("out", "dq", "dk", "dv"), (out, *grads),
                               (ref_out, *(t.grad for t in ref)), strict=True):
        assert got.dtype == q.dtype and got.shape == want.shape, name
        assert not torch.isnan(got).any(), f"NaN in {name}"
        error = ((got.double() - want).norm() / want.norm()).item()
        assert error < (OUT_TOLERANCE if name == "out" else GRAD_TOLERANCE), \
            f"{name}: relative error {error} ({ran})"
    return ran


CASES = {  # id: (length, head dim, mask, causal, heads, kv heads, enable_gqa, repeat_kv)
    "causal-200-d64": (200, 64, None, True, 4, 4, False, False),
    "causal-1000-d128": (1000, 128, None, True, 4, 4, False, False),
    "no-mask-333-d64": (333, 64, None, False, 4, 4, False, False),
    "bool-mask-300-d64": (300, 64, "bool", False, 4, 4, False, False),
    "additive-mask-256-d128": (256, 128, "additive", False, 4, 4, False, False),
    "enable-gqa-333-d128": (333, 128, None, True, 8, 2, True, False),
    "repeated-kv-333-d128": (333, 128, None, True, 8, 2, False, True),
}


def case_inputs(case_id):
    length, head_dim, mask, causal, heads, kv_heads, gqa, repeat_kv = CASES[case_id]
    q, k, v, made, grad_out = make_inputs(length, head_dim, mask, heads, kv_heads)
    return (q, k, v, made, grad_out, causal), dict(gqa=gqa, repeat_kv=repeat_kv)


@pytest.mark.parametrize("case_id", list(CASES))
def test_ours_forward_and_backward(case_id):
    args, kwargs = case_inputs(case_id)
    check(*args, **kwargs, forward="ours", backward="ours")


@pytest.mark.parametrize("backend", list(CHECKS))
@pytest.mark.parametrize("case_id", ["causal-1000-d128", "additive-mask-256-d128"])
def test_each_eligible_aten_backend(case_id, backend):
    args, kwargs = case_inputs(case_id)
    q, k, v, mask, _, causal = args
    if not eligible(backend, q, k, v, mask, causal, kwargs["gqa"]):
        pytest.skip(f"SDPA's {backend} backend does not take this case here")
    check(*args, **kwargs, forward=backend, backward=backend)


@pytest.mark.parametrize("forward, backward", [("ours", "cudnn"), ("cudnn", "ours"),
                                               ("ours", "efficient"), ("efficient", "ours"),
                                               ("flash", "ours")])
@pytest.mark.parametrize("case_id", ["causal-1000-d128", "additive-mask-256-d128"])
def test_a_backward_reads_another_choices_forward(case_id, forward, backward):
    """The canonical logsumexp between different kernels (ours: log2 units; cuDNN's
    (B, H, Lq, 1); efficient's padded)."""
    args, kwargs = case_inputs(case_id)
    q, k, v, mask, _, causal = args
    for backend in {forward, backward} - {"ours"}:
        if not eligible(backend, q, k, v, mask, causal, kwargs["gqa"]):
            pytest.skip(f"SDPA's {backend} backend does not take this case here")
    check(*args, **kwargs, forward=forward, backward=backward)


def test_timed_freely_the_fastest_choice_runs_and_is_right():
    q, k, v, _, grad_out = make_inputs(1024, 128, None, heads=8, kv_heads=8)
    ran = check(q, k, v, None, grad_out, True)
    assert set(ran) <= {"cutedsl", *CHECKS}, ran


def test_switched_off_sdpa_runs_its_own_backend():
    q, k, v, _, grad_out = make_inputs(256, 64, None)
    *_, fwd_code, bwd_code = compiled_step(q, k, v, None, grad_out, True, sdpa=False)
    assert "torch.ops.cutedsl.sdpa" not in fwd_code + bwd_code
    assert SDPA_OP_PAIR.search(fwd_code) and SDPA_OP_PAIR.search(bwd_code)


# ------------------------------------------------------------------------ Llama
# Two layers, hidden 1024, 8 heads of 128, 2 KV heads (transformers calls SDPA with
# enable_gqa and is_causal), bf16; one training step of logits.float().square().mean().

def tiny_llama():
    import transformers

    cfg = transformers.LlamaConfig(
        hidden_size=1024, intermediate_size=2048, num_attention_heads=8,
        num_key_value_heads=2, num_hidden_layers=2, vocab_size=1000,
        max_position_embeddings=1024)
    cfg._attn_implementation = "sdpa"  # as bench model sets it
    torch.manual_seed(0)
    with torch.device("cuda"):
        return transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)


def train_step(model, ids):
    """The loss and every parameter's gradient, fp32."""
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, use_cache=False).logits.float().square().mean()
    loss.backward()
    return [loss.detach().float().reshape(1)] + [p.grad.float() for p in model.parameters()]


def worst_error(got, want):
    return max(((g - w).norm() / w.norm().clamp_min(1e-30)).item()
               for g, w in zip(got, want, strict=True))


@pytest.mark.parametrize("forced", [True, False], ids=["ours-forced", "free"])
def test_llama_trains_through_the_choice_set(forced):
    from torch._inductor.utils import run_and_get_code

    pytest.importorskip("transformers")
    model = tiny_llama()
    ids = torch.randint(0, 1000, (2, 300), device="cuda")
    reference = copy.deepcopy(model).float()
    want = train_step(reference, ids)
    eager_error = worst_error(train_step(model, ids), want)
    torch._dynamo.reset()
    compiled = torch.compile(model, mode="max-autotune-no-cudagraphs")
    # forced: every choice but ATen's SDPA ones kept, so ours is the attention's
    name_filter = rf"{OURS}|^(?!cutedsl_sdpa_)" if forced else None
    with torch._inductor.config.patch({"test_configs.autotune_choice_name_regex": name_filter,
                                       "max_autotune_gemm_backends": "ATEN,CUTEDSL"}), \
            config.patch(sdpa=True, flex_max_configs=1):
        got, codes = run_and_get_code(train_step, compiled, ids)
    code = "\n".join(codes)
    ours = re.findall(rf"^({OURS}\w*) = load_kernel\(", code, re.M)
    aten = re.findall(r"torch\.ops\.cutedsl\.sdpa(_backward)?\.default\(", code)
    if forced:
        assert any("_bwd_" in name for name in ours), "our backward is not in the code"
        assert any("_bwd_" not in name for name in ours), "our forward is not in the code"
    else:
        assert ours or aten, "the SDPA choice set is not in the output code"
    assert not SDPA_OP_PAIR.search(code), "SDPA's own op pair ran"
    error = worst_error(got, want)
    assert error <= 2 * eager_error + 1e-3, (error, eager_error)
