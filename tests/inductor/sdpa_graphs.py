"""Joint graphs of scaled_dot_product_attention as AOT autograd traces them on a GPU,
for the CPU tests of the SDPA choice set.

Two stand-ins for what a CPU-only torch lacks: its SDPA picks the math backend for fake
CUDA tensors (``_fused_sdp_choice``'s CUDA kernel is not built), so the traced function
calls the chosen backend's op as SDPA would, the mask preprocessed as SDPA does (a bool
mask made additive in the query's dtype, expanded to (B, H, Lq, Lk)); and autograd of
fake CUDA tensors needs a CUDA build, so the backward op is called as its derivative
formula calls it, on the forward's outputs."""

import dataclasses

import torch
from torch._inductor.decomposition import select_decomp_table
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

aten = torch.ops.aten


@dataclasses.dataclass(frozen=True)
class Case:
    backend: str = "flash"
    causal: bool = True
    mask: str | None = None  # None, "bool", "additive", "per_head"
    batch: int = 2
    heads: int = 4
    kv_heads: int = 4
    seq: int = 256
    kv_seq: int | None = None
    head_dim: int = 64
    dropout: float = 0.0
    device: str = "cuda"
    backward: bool = True
    dtype: torch.dtype = torch.bfloat16
    layout: str = "blhd"  # q, k, v and grad in (B, L, H, D) memory order, or "bhld"
    repeat_kv: bool = False  # K and V of kv_heads repeated to heads, as transformers' repeat_kv


def _blhd(shape, case):
    b, h, s, d = shape
    if case.layout == "bhld":
        return torch.empty(b, h, s, d, device=case.device, dtype=case.dtype)
    return torch.empty(b, s, h, d, device=case.device, dtype=case.dtype).transpose(1, 2)


def trace(case: Case):
    """(graph module, its example inputs, its fake mode)."""
    kv_seq = case.kv_seq or case.seq
    mode = FakeTensorMode()
    with mode:
        q = _blhd((case.batch, case.heads, case.seq, case.head_dim), case)
        k = _blhd((case.batch, case.kv_heads, kv_seq, case.head_dim), case)
        v = _blhd((case.batch, case.kv_heads, kv_seq, case.head_dim), case)
        grad = _blhd((case.batch, case.heads, case.seq, case.head_dim), case)
        mask_heads = case.heads if case.mask == "per_head" else 1
        mask = torch.empty(case.batch, mask_heads, case.seq, kv_seq, device=case.device,
                           dtype=torch.bool if case.mask == "bool" else case.dtype)
    scale = case.head_dim ** -0.5
    size = (case.batch, case.heads, case.seq, kv_seq)

    def fn(q, k, v, mask, grad):
        if case.repeat_kv:
            b, hk, s, d = k.shape
            k, v = (x.unsqueeze(2).expand(b, hk, case.heads // hk, s, d)
                    .reshape(b, case.heads, s, d) for x in (k, v))
        bias = None
        if case.mask is not None:
            bias = mask
            if mask.dtype == torch.bool:
                bias = torch.where(mask, 0.0, float("-inf")).to(case.dtype)
            bias = bias.expand(size)
        p, causal = case.dropout, case.causal
        if case.backend == "flash":
            out, lse, cq, ck, mq, mk, seed, off, _ = aten._scaled_dot_product_flash_attention(
                q, k, v, p, causal, scale=scale)
            if not case.backward:
                return (out,)
            grads = aten._scaled_dot_product_flash_attention_backward(
                grad, q, k, v, out, lse, cq, ck, mq, mk, p, causal, seed, off, scale=scale)
        elif case.backend == "efficient":
            out, lse, seed, off = aten._scaled_dot_product_efficient_attention(
                q, k, v, bias, case.backward, p, causal, scale=scale)
            if not case.backward:
                return (out,)
            grads = aten._scaled_dot_product_efficient_attention_backward(
                grad, q, k, v, bias, out, lse, seed, off, p, [True, True, True, False], causal,
                scale=scale)[:3]
        else:
            out, lse, cq, ck, mq, mk, seed, off, _ = aten._scaled_dot_product_cudnn_attention(
                q, k, v, bias, case.backward, p, causal, scale=scale)
            if not case.backward:
                return (out,)
            grads = aten._scaled_dot_product_cudnn_attention_backward(
                grad, q, k, v, out, lse, seed, off, bias, cq, ck, mq, mk, p, causal,
                scale=scale)
        return (out, *grads)

    args = (q, k, v, mask, grad)
    gm = make_fx(fn, decomposition_table=select_decomp_table(), tracing_mode="fake")(*args)
    return gm, args, mode


def targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]
