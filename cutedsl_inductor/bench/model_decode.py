"""``bench model``'s ``decode``: generation with transformers' static KV cache, as its
torch.compile recipe runs it (``StaticCache``, the prompt's prefill in eager, one compiled
function per generated token).

Per shape (batch, context), the variants share one ``StaticCache`` of context + N tokens
and one prompt of random token ids, prefilled once by the eager model in chunks of 2048
tokens (the logits of the last position alone). A timed unit is a generation of N tokens
(``--new-tokens``) from the prompt: the cache rewound to the prompt's end (each layer's
length set back; the keys past it are masked until overwritten), then N greedy steps of
``decode_step`` each fed the token the one before chose (cloned: under CUDA graphs an
output lives in the graph's memory, and each step begins a new graph generation,
``torch.compiler.cudagraph_mark_step_begin``). ms per token is the unit's time over N;
tokens per second, batch x 1000 over it.

Checked (``check``): the cache prefilled again from scratch (a sliding-window layer that is
full rolls its keys, which rewinding does not undo), then 4 steps fed fixed random tokens;
their logits for the first 4 sequences against an fp32 copy's (its own cache, the same
prompt rows and tokens, computed once before the variants compile).
"""

from __future__ import annotations

from typing import Any

from .model_workloads import Shape, rel_error

PREFILL_CHUNK = 2048
CHECK_STEPS = 4
CHECK_ROWS = 4


def decode_step(model: Any, token: Any, cache: Any) -> tuple[Any, Any]:
    """One generated token per sequence (greedy) and the logits it was chosen from."""
    logits = model(input_ids=token, past_key_values=cache, use_cache=True).logits[:, -1]
    return logits.argmax(-1, keepdim=True), logits


def prefill(model: Any, prompt: Any, cache: Any) -> Any:
    """The prompt into ``cache`` in chunks; the logits of its last position."""
    for start in range(0, prompt.shape[1], PREFILL_CHUNK):
        logits = model(input_ids=prompt[:, start:start + PREFILL_CHUNK], past_key_values=cache,
                       use_cache=True, logits_to_keep=1).logits
    return logits[:, -1]


def rewind(cache: Any, length: int) -> None:
    """Each layer of a ``StaticCache`` back to ``length`` tokens (its length tensor, and
    a sliding-window layer's Python int too)."""
    for layer in cache.layers:
        layer.cumulative_length.fill_(length)
        if hasattr(layer, "cumulative_length_int"):
            layer.cumulative_length_int = length


def forced_logits(step: Any, model: Any, cache: Any, tokens: Any, rows: int) -> Any:
    """The logits (fp32, the first ``rows`` sequences) of one step per column of ``tokens``."""
    import torch

    logits = []
    for index in range(tokens.shape[1]):
        torch.compiler.cudagraph_mark_step_begin()
        _, out = step(model, tokens[:, index:index + 1].contiguous(), cache)
        logits.append(out[:rows].float())
    return torch.stack(logits, 1)


class Decode:
    """One decode shape: the prompt, the fixed tokens of the check, the shared cache."""

    def __init__(self, shape: Shape, vocab: int, new_tokens: int, device: str) -> None:
        import torch

        torch.manual_seed(1)
        self.shape, self.new_tokens = shape, new_tokens
        self.prompt = torch.randint(0, vocab, (shape.batch, shape.seq), device=device)
        self.forced = torch.randint(0, vocab, (shape.batch, min(CHECK_STEPS, new_tokens)),
                                    device=device)
        self.rows = min(shape.batch, CHECK_ROWS)
        self.refs: Any = None
        self.cache: Any = None

    def _cache(self, model: Any, tokens: int) -> Any:
        from transformers import StaticCache

        return StaticCache(config=model.config, max_cache_len=self.shape.seq + tokens)

    def reference(self, fp32_model: Any) -> None:
        cache = self._cache(fp32_model, self.forced.shape[1])
        prefill(fp32_model, self.prompt[:self.rows], cache)
        self.refs = forced_logits(decode_step, fp32_model, cache, self.forced[:self.rows],
                                  self.rows)

    def target(self, model: Any) -> Any:
        """What a variant compiles: the step, which takes its model."""
        return decode_step

    def start(self, model: Any) -> None:
        """The shared cache, prefilled by ``model`` (eager), and the first token."""
        self.model = model
        self.cache = self._cache(model, self.new_tokens)
        self.first = prefill(model, self.prompt, self.cache).argmax(-1, keepdim=True)

    def restore(self) -> None:
        """The cache as the prompt's prefill leaves it."""
        self.cache.reset()
        prefill(self.model, self.prompt, self.cache)

    def runner(self, model: Any, compiled: Any) -> DecodeRunner:
        return DecodeRunner(self, model, compiled)

    def close(self) -> None:
        self.cache = self.refs = self.model = None


class DecodeRunner:
    def __init__(self, decode: Decode, model: Any, step: Any) -> None:
        self.decode, self.model, self.step = decode, model, step
        self.per_unit = decode.new_tokens

    def prepare(self) -> None:
        rewind(self.decode.cache, self.decode.shape.seq)
        self.token = self.decode.first

    def run(self) -> Any:
        import torch

        torch.compiler.cudagraph_mark_step_begin()
        token, _ = self.step(self.model, self.token, self.decode.cache)
        self.token = token.clone()
        return self.token

    def check(self) -> float:
        decode = self.decode
        decode.restore()
        logits = forced_logits(self.step, self.model, decode.cache, decode.forced, decode.rows)
        return rel_error([logits], [decode.refs])
