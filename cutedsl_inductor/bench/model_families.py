"""``bench model``'s model families: transformers models with the shapes of real ones,
random weights, bf16, sdpa attention, dropout off (outputs are compared), at a chosen depth.

Decoders, each with a KV cache for ``decode``: ``llama`` (Llama-3-8B: hidden 4096, SwiGLU
MLP of 14336, 32 heads, 8 KV heads, vocab 128256), ``mistral`` (Mistral-7B: the same
layers, vocab 32000, sliding-window attention over 4096 keys: under a static KV cache,
transformers keeps the window's length as a Python int, a new one per token, so a compiled
decode step takes it as a symbolic int and CUDA graphs record one graph per position),
``phi3`` (Phi-3-mini: hidden 3072, fused QKV and gate/up projections, MLP 8192, 32 heads,
vocab 32064) and ``gpt2`` (GPT-2 XL: hidden 1600, Linear + bias + GELU MLPs of 6400, 25
heads, vocab 50257). An encoder: ``bert`` (BERT-large: hidden 1024, Linear + bias + GELU
MLPs of 4096, 16 heads, vocab 30522, a masked-LM head), whose sequences hold at most 512
tokens. Learned or RoPE positions cover 8192 tokens (GPT-2 XL's real table: 1024), for
contexts of 4096 plus the generated tokens.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    config_class: str  # transformers' names
    model_class: str
    shapes: tuple[tuple[str, Any], ...]  # the config's arguments: the real model's shapes
    decoder: bool = True  # a causal LM with a KV cache (decode); else an encoder
    max_seq: int = 8192  # tokens one sequence may hold

    def config(self, layers: int, **overrides: Any) -> Any:
        """The transformers config of ``layers`` layers (``overrides``: other arguments,
        e.g. a tiny model's sizes)."""
        import transformers

        cfg = getattr(transformers, self.config_class)(
            **{**dict(self.shapes), "num_hidden_layers": layers, **overrides})
        cfg._attn_implementation = "sdpa"
        return cfg

    def build(self, layers: int, device: str = "cuda", **overrides: Any) -> Any:
        """The model, random weights (seed 0), bf16, in eval mode, on ``device``."""
        import torch
        import transformers

        torch.manual_seed(0)
        with torch.device(device):
            model = getattr(transformers, self.model_class)(self.config(layers, **overrides))
        return model.to(torch.bfloat16).eval()

    def fit(self, batch: int, seq: int) -> tuple[int, int]:
        """``batch`` x ``seq`` tokens as sequences this family takes: a longer sequence is
        split into equal ones (BERT: 4 x 2048 tokens are 16 x 512)."""
        parts = math.ceil(seq / self.max_seq)
        return batch * parts, seq // parts


_LLAMA_LAYER = (("hidden_size", 4096), ("intermediate_size", 14336),
                ("num_attention_heads", 32), ("num_key_value_heads", 8))
FAMILIES = {family.name: family for family in (
    Family("llama", "LlamaConfig", "LlamaForCausalLM", _LLAMA_LAYER + (
        ("vocab_size", 128256), ("max_position_embeddings", 8192), ("rope_theta", 500000.0)),
    ),
    Family("mistral", "MistralConfig", "MistralForCausalLM", _LLAMA_LAYER + (
        ("vocab_size", 32000), ("max_position_embeddings", 8192), ("rope_theta", 10000.0),
        ("sliding_window", 4096))),
    Family("phi3", "Phi3Config", "Phi3ForCausalLM", (
        ("hidden_size", 3072), ("intermediate_size", 8192), ("num_attention_heads", 32),
        ("num_key_value_heads", 32), ("vocab_size", 32064), ("max_position_embeddings", 8192))),
    Family("gpt2", "GPT2Config", "GPT2LMHeadModel", (
        ("n_embd", 1600), ("n_inner", 6400), ("n_head", 25), ("vocab_size", 50257),
        ("n_positions", 8192), ("resid_pdrop", 0.0), ("embd_pdrop", 0.0), ("attn_pdrop", 0.0))),
    Family("bert", "BertConfig", "BertForMaskedLM", (
        ("hidden_size", 1024), ("intermediate_size", 4096), ("num_attention_heads", 16),
        ("vocab_size", 30522), ("max_position_embeddings", 512), ("hidden_dropout_prob", 0.0),
        ("attention_probs_dropout_prob", 0.0)), decoder=False, max_seq=512),
)}
