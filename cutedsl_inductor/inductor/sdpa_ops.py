"""``cutedsl::sdpa`` and ``cutedsl::sdpa_backward``: one SDPA forward and backward for
every ATen backend, with the logsumexp in one canonical form.

AOT autograd traces ``scaled_dot_product_attention`` into one backend's op pair
(``_scaled_dot_product_{flash,efficient,cudnn}_attention`` and its ``_backward``), whose
saved logsumexp differs in layout: flash (B, H, Lq), cuDNN (B, H, Lq, 1), efficient
(B, H, Lq padded to 32); all in natural-log units (our FlexAttention kernel stores log2
units). ``inductor/sdpa_pass.py`` rewrites the pair into these two ops, so that the
forward and the backward are lowered -- and autotuned, ``inductor/sdpa.py`` -- each on
its own: whatever backend computes the forward, the backward reads the same tensors.

The canonical logsumexp (``lse``): (B, Hq, Lq) float32, contiguous, natural log. Every
forward returns it and every backward reads it (``to_canonical`` / ``from_canonical``).

Both ops take ``backends``, the ATen backends eligible for the inputs (decided where the
graph was traced, the traced one first); run eagerly, or as the output code's call where
an ATen backend won, they run ``first(backends)``. Their scope is what the rewrite admits:
dropout 0 (no RNG state: the backward makes the philox seed and offset tensors it never
reads), an additive float bias or none, no gradient for the bias.
"""

from __future__ import annotations

import math

import torch

aten = torch.ops.aten

BACKENDS = ("flash", "cudnn", "efficient")
LN2 = math.log(2.0)
_EFFICIENT_LSE_ALIGN = 32  # the efficient kernel's logsumexp is padded to this


def first(backends: str) -> str:
    return backends.split(",")[0]


def to_canonical(backend: str, lse: torch.Tensor, lq: int) -> torch.Tensor:
    """A backend forward's logsumexp as (B, H, Lq) float32, contiguous (no copy: a
    custom op's fake strides must be its real ones, and a fake CUDA copy needs a CUDA
    build)."""
    if backend == "cudnn":  # (B, H, Lq, 1), contiguous
        return lse.squeeze(-1)
    if backend == "efficient":  # cropped (a negative pad): a new, contiguous tensor
        return aten.constant_pad_nd(lse, [0, lq - lse.shape[-1]])
    return lse


def from_canonical(backend: str, lse: torch.Tensor) -> torch.Tensor:
    """The canonical logsumexp as ``backend``'s backward reads it."""
    if backend == "cudnn":
        return lse.unsqueeze(-1)
    if backend == "efficient":
        lq = lse.shape[-1]
        return aten.constant_pad_nd(lse, [0, -(-lq // _EFFICIENT_LSE_ALIGN)
                                          * _EFFICIENT_LSE_ALIGN - lq])
    return lse


def _bhld(x: torch.Tensor) -> torch.Tensor:
    """``x`` with the (B, L, H, D) memory order the efficient backward needs for out and
    grad_out (pytorch#138772)."""
    if x.stride(3) == 1 and x.stride(1) == x.shape[3] and x.stride(2) == x.shape[1] * x.shape[3]:
        return x
    return x.transpose(1, 2).contiguous().transpose(1, 2)


def _per_head(bias: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor
              ) -> torch.Tensor | None:
    """``bias`` as the efficient kernel takes it: (B, Hq, Lq, Lk), a mask broadcast over
    heads expanded (a view: eager SDPA expands it so before that kernel too)."""
    if bias is None:
        return None
    return bias.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])


def forward(backend: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            bias: torch.Tensor | None, is_causal: bool, scale: float
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, canonical lse) by ``backend``'s ATen kernel."""
    if backend == "flash":
        out, lse = aten._scaled_dot_product_flash_attention(
            q, k, v, 0.0, is_causal, False, scale=scale)[:2]
    elif backend == "cudnn":
        out, lse = aten._scaled_dot_product_cudnn_attention(
            q, k, v, bias, True, 0.0, is_causal, False, scale=scale)[:2]
    elif backend == "efficient":
        out, lse = aten._scaled_dot_product_efficient_attention(
            q, k, v, _per_head(bias, q, k), True, 0.0, is_causal, scale=scale)[:2]
    else:
        raise ValueError(f"unknown SDPA backend {backend!r}: one of {BACKENDS}")
    return out, to_canonical(backend, lse, q.shape[2])


def backward(backend: str, grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
             v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, bias: torch.Tensor | None,
             is_causal: bool, scale: float, fake: bool = False
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) by ``backend``'s ATen kernel, from the canonical ``lse`` (``fake``:
    shapes only, out and grad_out left in their order)."""
    lq, lk = q.shape[2], k.shape[2]
    native = from_canonical(backend, lse)
    long = dict(dtype=torch.int64, device=q.device)
    if backend == "flash":  # its seed and offset are uint64 (read only under dropout)
        seed = torch.empty(2, dtype=torch.uint64, device=q.device)
        offset = torch.empty((), dtype=torch.uint64, device=q.device)
        return tuple(aten._scaled_dot_product_flash_attention_backward(
            grad_out, q, k, v, out, native, None, None, lq, lk, 0.0, is_causal, seed, offset,
            scale=scale))
    if backend == "cudnn":
        seed, offset = torch.empty((), **long), torch.empty((), **long)
        return tuple(aten._scaled_dot_product_cudnn_attention_backward(
            grad_out, q, k, v, out, native, seed, offset, bias, None, None, lq, lk, 0.0,
            is_causal, scale=scale))
    if backend == "efficient":
        seed, offset = torch.empty((), **long), torch.empty((), **long)
        grads = aten._scaled_dot_product_efficient_attention_backward(
            grad_out if fake else _bhld(grad_out), q, k, v, _per_head(bias, q, k),
            out if fake else _bhld(out),
            native, seed, offset, 0.0,
            [True, True, True, False], is_causal, scale=scale)
        return tuple(grads[:3])
    raise ValueError(f"unknown SDPA backend {backend!r}: one of {BACKENDS}")


# No layout tag: the inputs' layout constraint is ``inductor/sdpa.py``'s
# (``constrain_inputs``), which keeps a bias broadcast over heads broadcast.
@torch.library.custom_op("cutedsl::sdpa", mutates_args=())
def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
         is_causal: bool, scale: float, backends: str
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """SDPA forward by ``first(backends)``: (out, lse), lse canonical."""
    return forward(first(backends), q, k, v, bias, is_causal, scale)


@sdpa.register_fake
def _(q, k, v, bias, is_causal, scale, backends):
    return forward(first(backends), q, k, v, bias, is_causal, scale)


@torch.library.custom_op("cutedsl::sdpa_backward", mutates_args=())
def sdpa_backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  out: torch.Tensor, lse: torch.Tensor, bias: torch.Tensor | None,
                  is_causal: bool, scale: float, backends: str
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SDPA backward by ``first(backends)``: (dq, dk, dv) from the canonical lse."""
    return backward(first(backends), grad_out, q, k, v, out, lse, bias, is_causal, scale)


@sdpa_backward.register_fake
def _(grad_out, q, k, v, out, lse, bias, is_causal, scale, backends):
    return backward(first(backends), grad_out, q, k, v, out, lse, bias, is_causal, scale,
                    fake=True)
