"""``bench model``'s families on CPU: the real models' shapes as configs, and tiny models
of each family built by transformers with their layers' structure."""

import pytest

from cutedsl_inductor.bench.model_families import FAMILIES

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

_LAYER = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, vocab_size=256)
TINY = {  # each family's layers at a tiny size (token ids within the vocabulary)
    "llama": _LAYER | dict(num_key_value_heads=2),
    "mistral": _LAYER | dict(num_key_value_heads=2, sliding_window=16),
    "phi3": _LAYER | dict(num_key_value_heads=4, pad_token_id=0, bos_token_id=1,
                          eos_token_id=1),
    "gpt2": dict(n_embd=64, n_inner=128, n_head=4, vocab_size=256, bos_token_id=1,
                 eos_token_id=1),
    "bert": _LAYER | dict(pad_token_id=0),
}


def tiny(family, layers=2):
    return FAMILIES[family].build(layers, "cpu", **TINY[family])


@pytest.mark.parametrize("family,shapes", [
    ("llama", dict(hidden_size=4096, intermediate_size=14336, num_key_value_heads=8,
                   vocab_size=128256)),
    ("mistral", dict(hidden_size=4096, intermediate_size=14336, num_key_value_heads=8,
                     sliding_window=4096, vocab_size=32000)),
    ("phi3", dict(hidden_size=3072, intermediate_size=8192, num_attention_heads=32,
                  vocab_size=32064)),
    ("gpt2", dict(n_embd=1600, n_inner=6400, n_head=25, vocab_size=50257)),
    ("bert", dict(hidden_size=1024, intermediate_size=4096, num_attention_heads=16,
                  max_position_embeddings=512)),
])
def test_the_configs_have_the_real_models_shapes_at_the_depth_asked(family, shapes):
    cfg = FAMILIES[family].config(8)
    assert {name: getattr(cfg, name) for name in shapes} == shapes
    assert cfg.num_hidden_layers == 8 and cfg._attn_implementation == "sdpa"
    decoder = FAMILIES[family].decoder
    assert decoder == (family != "bert")
    # room for a context of 4096 and the generated tokens
    assert (cfg.max_position_embeddings >= 8192) == decoder


def test_each_family_has_its_layers_structure():
    modules = {family: {name.rsplit(".", 1)[-1]: type(module).__name__
                        for name, module in tiny(family).named_modules()}
               for family in FAMILIES}
    assert {"gate_proj", "up_proj", "down_proj"} <= modules["llama"].keys()  # SwiGLU
    assert {"qkv_proj", "gate_up_proj"} <= modules["phi3"].keys()  # fused projections
    assert "q_proj" not in modules["phi3"]
    assert modules["gpt2"]["c_fc"] == "Conv1D"  # Linear + bias (transposed weight), GELU
    assert modules["bert"]["dense"] == "Linear" and modules["bert"]["decoder"] == "Linear"
    bert = tiny("bert")
    assert bert.bert.encoder.layer[0].intermediate.dense.bias is not None
    assert "GELU" in type(bert.bert.encoder.layer[0].intermediate.intermediate_act_fn).__name__
    assert next(bert.parameters()).dtype == torch.bfloat16 and not bert.training


def test_an_encoder_takes_the_tokens_as_sequences_of_its_length():
    assert FAMILIES["bert"].fit(4, 2048) == (16, 512)
    assert FAMILIES["bert"].fit(2, 300) == (2, 300)
    assert FAMILIES["llama"].fit(4, 2048) == (4, 2048)
