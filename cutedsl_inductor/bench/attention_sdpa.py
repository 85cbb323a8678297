"""``bench attention``'s SDPA variants, on plain causal cases only: ``sdpa-flash`` and
``sdpa-cudnn``, eager ``scaled_dot_product_attention(is_causal=True)`` on that backend,
and ``sdpa-choice``, the same call under torch.compile max-autotune with ``config.sdpa``
on (``inductor/sdpa_pass.py``: the forward and the backward each autotuned over every
eligible ATen backend and our FlexAttention kernels). Its ``kernel`` column is what won
the timed pass as the output code says: ``cutedsl`` (our kernel) or the ATen backend;
an output code with neither (the choice set did not run) is the variant's error.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch

SDPA = {"sdpa-flash": "FLASH_ATTENTION", "sdpa-cudnn": "CUDNN_ATTENTION"}
CHOICE = "sdpa-choice"
NAMES = (*SDPA, CHOICE)
_OURS = re.compile(r"^cutedsl_\w*flex\w* = load_kernel\(", re.M)
_ATEN = re.compile(r"torch\.ops\.cutedsl\.sdpa(?:_backward)?\.default\(.*'(\w+)'\)")


def sdpa_attention(name: str) -> Callable:
    """SDPA variant ``name`` as a function of (q, k, v) -> out."""
    def plain(q: Any, k: Any, v: Any) -> Any:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    if name == CHOICE:
        return torch.compile(plain, dynamic=False, mode="max-autotune-no-cudagraphs")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, SDPA[name])

    def eager(q: Any, k: Any, v: Any) -> Any:
        with sdpa_kernel(backend):
            return plain(q, k, v)
    return eager


def sdpa_kernel_of(name: str, codes: list[str], direction: str) -> str:
    """What ran the timed pass of SDPA variant ``name`` (``codes``: its output code, graph
    by graph); RuntimeError where the choice set is not in it."""
    if name != CHOICE:
        return name.removeprefix("sdpa-")
    code = (codes[0] if direction == "fwd" else codes[-1]) if codes else ""
    if _OURS.search(code):
        return "cutedsl"
    found = _ATEN.search(code)
    if found is None:
        raise RuntimeError("the SDPA choice set is not in the output code (it runs with "
                           "config.sdpa on, under max-autotune, for an sm_90 GPU)")
    return found.group(1)
