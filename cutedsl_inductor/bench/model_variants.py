"""``bench model``'s variants: what each compiles with, and the proof that each compiled
its own graph.

``eager``; ``default`` (torch.compile; ``"reduce-overhead"`` under CUDA graphs);
``max-autotune`` (``max_autotune_gemm_backends="ATEN,TRITON"``); ``cutedsl``
(ATEN,TRITON,CUTEDSL, with our levers where set, else the package's: ``epilogue_fusion``,
``gemm_pdl``, ``prologue_fusion``, ``sdpa``); ``cutedsl-no-triton`` (ATEN,CUTEDSL). The
max-autotune variants take the options of ``mode="max-autotune"`` (CUDA graphs) or
``"max-autotune-no-cudagraphs"``.

Several variants live in one process, so that they can be timed in interleaved rounds.
Each is ``torch.compile`` of its own copy of the model (or of a function that takes its
copy) with its Inductor options given to ``torch.compile`` (so its backend is its own:
Dynamo keeps a cache entry per backend and guards the copy's parameters), and
``patched`` sets those options and our knobs around every call that may compile: a
backward compiles in the first training step, and our knobs are read while compiling.

``OutputCode`` records the output modules Inductor loads while it is active
(``PyCodeCache.load_by_key_path``, which a compile and an FX graph cache hit both call):
``check`` refuses a compiled variant that loaded none (it ran another variant's graph) and
a variant without CUTEDSL whose output code defines one of our kernels.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .. import config

NAMES = ("eager", "default", "max-autotune", "cutedsl", "cutedsl-no-triton")
BACKENDS = {"max-autotune": "ATEN,TRITON", "cutedsl": "ATEN,TRITON,CUTEDSL",
            "cutedsl-no-triton": "ATEN,CUTEDSL"}
# our levers: Variant's fields and the knobs (config.py) they set
LEVERS = {"fusion": "epilogue_fusion", "pdl": "gemm_pdl", "prologue": "prologue_fusion",
          "sdpa": "sdpa"}
_OUR_KERNEL = re.compile(r"^(cutedsl_\w+) = load_kernel\(", re.M)


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    fusion: bool | None = None  # ours only; None: config.epilogue_fusion as set
    pdl: bool | None = None  # ours only; None: config.gemm_pdl as set
    prologue: bool | None = None  # ours only; None: config.prologue_fusion as set
    sdpa: bool | None = None  # ours only; None: config.sdpa (SDPA's choice set) as set

    @classmethod
    def of_row(cls, row: dict[str, Any]) -> Variant:
        """The variant a row of ``bench model`` measured."""
        return cls(row["variant"], **{lever: row[lever] for lever in LEVERS})

    def columns(self) -> dict[str, Any]:
        """The variant as a row's columns (``of_row`` reads them back)."""
        return {"variant": self.name, **{lever: getattr(self, lever) for lever in LEVERS}}

    @property
    def ours(self) -> bool:
        return self.name.startswith("cutedsl")

    def knobs(self) -> dict[str, bool]:
        """Our knobs (``config.py``) this variant sets."""
        return {knob: getattr(self, lever) for lever, knob in LEVERS.items()
                if getattr(self, lever) is not None}

    @property
    def label(self) -> str:
        """The name and the settings the run gave, e.g. ``"cutedsl fusion off pdl on"``."""
        return self.name + settings(dataclasses.asdict(self))

    def inductor_options(self, graphs: bool) -> dict[str, Any]:
        """The Inductor options of this variant, under CUDA graphs or not."""
        from torch._inductor import list_mode_options

        if self.name == "eager":
            return {}
        if self.name == "default":
            return {"triton.cudagraphs": True} if graphs else {}
        mode = "max-autotune" if graphs else "max-autotune-no-cudagraphs"
        return {**list_mode_options(mode), "max_autotune_gemm_backends": BACKENDS[self.name]}

    @contextlib.contextmanager
    def patched(self, graphs: bool) -> Iterator[None]:
        """Inductor's config and our knobs as this variant compiles."""
        import torch

        with torch._inductor.config.patch(self.inductor_options(graphs)), \
                config.patch(**self.knobs()):
            yield

    def compile(self, fn: Any, graphs: bool) -> Any:
        """``fn`` (a model or a function) as this variant runs it."""
        import torch

        if self.name == "eager":
            return fn
        return torch.compile(fn, options=self.inductor_options(graphs) or None)


def settings(fields: dict[str, Any]) -> str:
    """The levers a variant (or its row) sets, as words: ``" fusion off pdl on"``, ``""``
    where it sets none."""
    words = {None: "", True: " {} on", False: " {} off"}
    return "".join(words[fields.get(lever)].format(lever) for lever in LEVERS)


class OutputCode:
    """The output modules Inductor loads while active (a context manager, not re-entrant)."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    def __enter__(self) -> OutputCode:
        from torch._inductor.codecache import PyCodeCache

        self._saved = PyCodeCache.__dict__["load_by_key_path"]
        load = self._saved.__func__
        paths = self.paths

        def recorded(cls: Any, key: str, path: str, *args: Any, **kwargs: Any) -> Any:
            paths.append(path)
            return load(cls, key, path, *args, **kwargs)

        PyCodeCache.load_by_key_path = classmethod(recorded)
        return self

    def __exit__(self, *exc: Any) -> None:
        from torch._inductor.codecache import PyCodeCache

        PyCodeCache.load_by_key_path = self._saved

    def graphs(self) -> list[str]:
        """The sources of the output modules loaded (those with Inductor's ``call``)."""
        texts = [Path(path).read_text() for path in dict.fromkeys(self.paths)
                 if Path(path).is_file()]
        return [text for text in texts if "def call(" in text]

    def our_kernels(self) -> int:
        """How many of our kernels the output modules define."""
        return len({name for text in self.graphs() for name in _OUR_KERNEL.findall(text)})

    def check(self, variant: Variant) -> int:
        """Our kernels in ``variant``'s output code; AssertionError where it loaded no
        output code or, without CUTEDSL, has one of our kernels."""
        if not self.graphs():
            raise AssertionError(f"{variant.label}: no output code loaded while it compiled "
                                 "(did it run another variant's graph?)")
        kernels = self.our_kernels()
        if kernels and not variant.ours:
            raise AssertionError(f"{variant.label}: {kernels} CuteDSL kernels in its output code")
        return kernels
