"""cutedsl_inductor: CuTe DSL templates as autotuning choices inside torch.compile.

Importing the package registers its scheduling, choices and passes in Inductor
(``inductor/install.py``; ``load()``). The pipeline, one subpackage per stage, each
importing only from those below it: ``compile`` (specs, compile once, disk and remote
caches) -> ``runtime`` (load and launch) -> ``autotune`` (benchmark requests, retiming) ->
``template`` (Jinja2 template -> choice) -> ``kernels`` (the built-in templates) ->
``inductor`` (scheduling, output code, passes); ``docs/architecture.md`` has the whole.

A compile worker's process (``runtime/zygote.py``: ``WORKER_ENV`` set) imports none of
it and registers nothing: it compiles only. The command line (the ``cutedsl-inductor``
script, ``cutedsl_inductor_cli``) imports the package with ``DEFER_ENV`` set, so that
``--help``, ``--version`` and ``cache info|clear`` import neither torch nor Inductor: then
``load()`` runs at the first use of a name below (``CuteDSLTemplate``, ...) or where a
command calls it (those that compile).

It imports private Inductor names, which change between torch releases: loading it under
a torch outside ``TESTED_TORCH`` (pyproject's range) warns once (``version.py``).
"""

import os
import warnings
from typing import Any

from .runtime.zygote import WORKER_ENV
from .version import TESTED_TORCH, __version__, untested_torch

# set by the command line's launcher while it imports the package
DEFER_ENV = "_CUTEDSL_INDUCTOR_DEFER_LOAD"

# the names ``load()`` defines, and the modules they come from
_LOADED_NAMES = {
    "autotune_select_algorithm": ".autotune.select",
    "install": ".inductor.install",
    "CuteDSLScheduling": ".inductor.scheduling",
    "CuteDSLKernelWrapper": ".runtime.wrapper",
    "CuteDSLTemplateBuffer": ".template.buffer",
    "CuteDSLTemplateCaller": ".template.caller",
    "CuteDSLTemplateKernel": ".template.kernel",
    "CuteDSLTemplate": ".template.template",
}
# names imported only where asked for, after ``load()``: ``CuteDSLCombinedScheduling``'s
# module imports Inductor's CUDA scheduling, which imports CuTe DSL on torch 2.14 and 2.15
# (``inductor/combined.py``), and a warm process does without both
_FIRST_USE_NAMES = {"CuteDSLCombinedScheduling": ".inductor.combined"}
_loaded = False


def load() -> None:
    """What importing the package does (once): warn under an untested torch, define the
    public names and install the package in Inductor."""
    global _loaded
    if _loaded:
        return
    import importlib

    import torch

    if (untested := untested_torch(torch.__version__)) is not None:
        warnings.warn(untested, stacklevel=2)
    # after the check: under an untested torch these imports are what may fail
    importlib.import_module(".compile.cache.artifacts", __name__)  # registers our cache artifacts
    for name, module in _LOADED_NAMES.items():
        globals()[name] = getattr(importlib.import_module(module, __name__), name)
    _loaded = True
    globals()["install"]()


def __getattr__(name: str) -> Any:
    """A name ``load()`` defines, where the import deferred it, or one of
    ``_FIRST_USE_NAMES``."""
    if name in _LOADED_NAMES and os.environ.get(WORKER_ENV) != "1":
        load()
        return globals()[name]
    if name in _FIRST_USE_NAMES and os.environ.get(WORKER_ENV) != "1":
        import importlib

        load()
        globals()[name] = getattr(importlib.import_module(_FIRST_USE_NAMES[name], __name__), name)
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if os.environ.get(WORKER_ENV) != "1" and os.environ.get(DEFER_ENV) != "1":
    load()

__all__ = ["TESTED_TORCH", "__version__", "untested_torch", "load", *_LOADED_NAMES,
           *_FIRST_USE_NAMES]
