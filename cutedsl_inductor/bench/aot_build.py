"""``bench aot``'s builds, each in a process of its own (``python -m
cutedsl_inductor.bench.aot_build reference|build CASE [VARIANT]``): a workload's module,
inputs and references, and its AOTInductor package per variant.

Workloads (``Case``, a transformers Llama of ``layers`` Llama-3-8B-shaped layers, random
weights from seed 0, so every process builds the same model): ``prefill``, the logits of
4 x 2048 tokens (no KV cache); ``decode``, one step of batch 8 at context ``context``: the
next token's logits, through transformers' export recipe for a static KV cache
(``TorchExportableModuleWithStaticCache``) whose cache tensors ``DecodeStep`` rebinds to
the module's buffers at every call, so that the export sees the step write them (a
buffer mutation, which AOTInductor keeps) instead of lifting copies as constants.

``reference``: the inputs (seed 1), saved to ``inputs.pt`` in the case's folder, and the
checked part of the outputs (``checked``: prefill's every 64th position) of an fp32 copy of
the model, to ``reference.pt`` with eager bf16's relative error to it. ``build``: the
module exported (torch.export, not strict) on those inputs and packaged by
``aoti_compile_and_package`` under the variant's options (``VARIANTS``: max-autotune with
``ATEN,TRITON``, or ``ATEN,TRITON,CUTEDSL`` with ``config.aot``); one ``ROW`` line with
the build's seconds, the package's MB and how many of our kernels it ships.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

from .. import config
from ..compile.exported import SHIPPED_SUFFIX
from .model_families import FAMILIES
from .model_variants import BACKENDS

WORKLOADS = ("prefill", "decode")
VARIANTS = ("cutedsl", "max-autotune")  # ours, then the baseline
PREFILL = (4, 2048)  # batch x tokens
DECODE_BATCH = 8
CHECK_STRIDE = 64  # prefill: the positions checked (0, 64, ...)
ROW = "ROW "


@dataclasses.dataclass(frozen=True)
class Case:
    workload: str
    layers: int
    context: int  # decode's position (its cache holds context + 1 tokens)
    folder: str  # inputs, references and packages

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Case:
        return cls(**json.loads(text))

    @property
    def check_stride(self) -> int:
        """The positions' stride of the outputs checked (1: all)."""
        return CHECK_STRIDE if self.workload == "prefill" else 1

    def package(self, variant: str) -> Path:
        return Path(self.folder) / f"{self.workload}-{variant}.pt2"


def prefill_logits(model: Any) -> Any:
    """``prefill``'s module: ``ids -> logits`` of every position."""
    import torch

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, ids: Any) -> Any:
            return self.model(input_ids=ids, use_cache=False).logits

    return Logits()


def decode_step(model: Any, batch: int, context: int, device: str) -> Any:
    """``decode``'s module: ``(tokens (batch, 1), position (1,)) -> logits (batch, vocab)``
    over a static KV cache of ``context + 1`` tokens (the step writes position ``context``)."""
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    class DecodeStep(TorchExportableModuleWithStaticCache):
        def forward(self, tokens: Any, position: Any) -> Any:
            for i, layer in enumerate(self.static_cache.layers):
                layer.keys = getattr(self, f"key_cache_{i}")
                layer.values = getattr(self, f"value_cache_{i}")
                layer.cumulative_length = getattr(self, f"cumulative_length_{i}")
            return super().forward(input_ids=tokens, cache_position=position)[:, -1]

    model.generation_config.use_cache = True
    model.generation_config.cache_implementation = "static"
    return DecodeStep(model, batch_size=batch, max_cache_len=context + 1, device=device)


def module_and_inputs(case: Case, model: Any, device: str) -> tuple[Any, tuple[Any, ...]]:
    """The module a case exports around ``model`` and its inputs (seed 1)."""
    import torch

    vocab = model.config.vocab_size
    generator = torch.Generator(device).manual_seed(1)
    if case.workload == "prefill":
        ids = torch.randint(0, vocab, PREFILL, device=device, generator=generator)
        return prefill_logits(model), (ids,)
    tokens = torch.randint(0, vocab, (DECODE_BATCH, 1), device=device, generator=generator)
    position = torch.tensor([case.context], device=device)
    return decode_step(model, DECODE_BATCH, case.context, device), (tokens, position)


def checked(case: Case, output: Any) -> Any:
    """The part of an output the check compares, as fp32."""
    return output[:, ::case.check_stride].float()


def reference(case: Case, device: str = "cuda", **overrides: Any) -> dict[str, Any]:
    """Save the inputs and the fp32 copy's checked outputs; eager bf16's error to them.
    ``overrides``: the config's sizes (a tiny model)."""
    import torch

    model = FAMILIES["llama"].build(case.layers, device, **overrides)
    wide = copy.deepcopy(model).float()
    module, inputs = module_and_inputs(case, model, device)
    wide_module, _ = module_and_inputs(case, wide, device)
    with torch.no_grad():
        want = checked(case, wide_module(*inputs))
        del wide_module, wide
        eager = checked(case, module(*inputs))
    error = float((eager - want).norm() / want.norm())
    folder = Path(case.folder)
    torch.save(inputs, folder / "inputs.pt")
    torch.save({"want": want.cpu(), "eager_error": error}, folder / "reference.pt")
    return {"eager_error": error}


def build(case: Case, variant: str, device: str = "cuda", **overrides: Any) -> dict[str, Any]:
    """Export the case's module and package it under ``variant``'s options."""
    import torch

    model = FAMILIES["llama"].build(case.layers, device, **overrides)
    module, _ = module_and_inputs(case, model, device)
    inputs = torch.load(Path(case.folder) / "inputs.pt", map_location=device)
    start = time.perf_counter()
    exported = torch.export.export(module, tuple(inputs), strict=False)
    options = {"max_autotune": True, "max_autotune_gemm_backends": BACKENDS[variant]}
    with torch._inductor.config.patch(options), config.patch(aot=variant == "cutedsl"):
        path = torch._inductor.aoti_compile_and_package(
            exported, package_path=str(case.package(variant)))
    names = [Path(name).name for name in zipfile.ZipFile(path).namelist()]
    ours = [n for n in names if n.startswith("cutedsl_") and n.endswith(SHIPPED_SUFFIX)]
    return {"build_s": time.perf_counter() - start, "kernels_of_ours": len(ours),
            "package_mb": Path(path).stat().st_size / 2**20}


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "reference":
        print(ROW + json.dumps(reference(Case.from_json(sys.argv[2]))), flush=True)
    elif len(sys.argv) == 4 and sys.argv[1] == "build" and sys.argv[3] in VARIANTS:
        print(ROW + json.dumps(build(Case.from_json(sys.argv[2]), sys.argv[3])), flush=True)
    else:
        sys.exit("usage: python -m cutedsl_inductor.bench.aot_build reference|build CASE "
                 "[VARIANT]")
