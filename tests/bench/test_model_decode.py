"""``bench model``'s decode on CPU: greedy generation with transformers' static KV cache,
the same tokens as transformers' own ``generate``, checked against an fp32 copy."""

import copy

import pytest

from cutedsl_inductor.bench.model_decode import Decode, decode_step
from cutedsl_inductor.bench.model_workloads import Shape
from tests.bench.test_model_families import tiny

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


@pytest.mark.parametrize("family", ["llama", "mistral", "phi3", "gpt2"])
def test_decode_is_greedy_generation_with_a_static_cache(family):
    model = tiny(family)
    decode = Decode(Shape(3, 12), model.config.vocab_size, new_tokens=8, device="cpu")
    decode.start(model)
    runner = decode.runner(model, decode_step)
    first, second = [], []
    for tokens in (first, second):  # a unit rewinds the cache to the prompt's end
        runner.prepare()
        tokens += [runner.run() for _ in range(runner.per_unit)]
    generated = torch.cat([decode.first, *first], 1)
    # mistral's window (16) fills up within the generation (12 + 9 tokens)
    expected = model.generate(decode.prompt, attention_mask=torch.ones_like(decode.prompt),
                              max_new_tokens=9, do_sample=False, cache_implementation="static",
                              pad_token_id=0)[:, 12:]
    assert torch.equal(generated, expected)
    if family != "mistral":  # a full sliding window rolled its keys: not rewound
        assert torch.equal(torch.cat(first, 1), torch.cat(second, 1))


@pytest.mark.parametrize("family,context", [("llama", 12), ("mistral", 16)])
def test_decode_steps_are_checked_against_an_fp32_copy(family, context):
    model = tiny(family)
    decode = Decode(Shape(6, context), model.config.vocab_size, new_tokens=8, device="cpu")
    decode.reference(copy.deepcopy(model).float())
    decode.start(model)
    runner = decode.runner(model, decode_step)
    for _ in range(2):  # units roll a full window; the check prefills again
        runner.prepare()
        for _ in range(runner.per_unit):
            runner.run()
    assert decode.refs.shape == (4, 4, model.config.vocab_size)  # 4 rows, 4 steps
    assert runner.check() < 0.02

    def stale(model, token, cache):  # a step that does not read the cache
        fresh = transformers.StaticCache(config=model.config, max_cache_len=4)
        return decode_step(model, token, fresh)

    assert decode.runner(model, stale).check() > 0.1
