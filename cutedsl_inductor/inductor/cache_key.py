"""Our part of Inductor's FX graph cache key.

Inductor reuses compiled graphs (output code) across processes when their cache key
matches. Output code written by one version of this package must not be run by another,
so ``install`` registers ``CacheKeyPass`` as the CUDA backend's custom graph pass: a
no-op pass (it calls the pass it replaced, if any) whose ``uuid`` -- part of the FX
graph cache key on every supported torch -- carries the versions of this package,
nvidia-cutlass-dsl and apache-tvm-ffi and the knobs that change generated code
(``package_fingerprint``; torch 2.13 also asks ``CuteDSLChoices.uuid`` for it).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import torch
from torch._inductor.custom_graph_pass import CustomGraphModulePass

from .. import config
from ..compile import versions


class CacheKeyPass(CustomGraphModulePass):
    def __init__(self, wrapped: CustomGraphModulePass | None = None) -> None:
        self.wrapped = wrapped

    def __call__(self, gm: torch.fx.GraphModule) -> None:
        if self.wrapped is not None:
            self.wrapped(gm)

    def uuid(self) -> Any:
        wrapped = self.wrapped.uuid() if self.wrapped is not None else None
        return package_fingerprint(wrapped)


def package_fingerprint(*extra: Any) -> str:
    """Hash of our versions and code-changing knobs (and ``extra``)."""
    material = {"versions": versions.toolchain_versions(), "config": config.snapshot(),
                "extra": extra}
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()


def install_cache_key() -> None:
    from torch._inductor.codegen import common

    current = common.custom_backend_passes.get("cuda")
    if not isinstance(current, CacheKeyPass):
        common.custom_backend_passes["cuda"] = CacheKeyPass(current)
