"""cutedsl_inductor: CuTe DSL templates as autotuning choices inside torch.compile.

Importing the package registers its scheduling, choices and passes in Inductor
(``inductor/install.py``). The pipeline, one subpackage per stage, each importing only
from those below it: ``compile`` (specs, compile once, disk and remote caches) ->
``runtime`` (load and launch) -> ``autotune`` (benchmark requests, retiming) ->
``template`` (Jinja2 template -> choice) -> ``kernels`` (the built-in templates) ->
``inductor`` (scheduling, output code, passes); ``docs/architecture.md`` has the whole.

A compile worker's process (``runtime/zygote.py``: ``WORKER_ENV`` set) imports none of
it and registers nothing: it compiles only.

It imports private Inductor names, which change between torch releases: importing it
under a torch outside ``TESTED_TORCH`` (pyproject's range) warns once (``version.py``).
"""

import os
import warnings

import torch

from .runtime.zygote import WORKER_ENV
from .version import TESTED_TORCH, __version__, untested_torch

if (_untested := untested_torch(torch.__version__)) is not None:
    warnings.warn(_untested, stacklevel=1)

if os.environ.get(WORKER_ENV) != "1":
    # after the check: under an untested torch these imports are what may fail
    from .autotune.select import autotune_select_algorithm
    from .compile import artifacts as _artifacts  # noqa: F401  (registers our cache artifacts)
    from .inductor.install import install
    from .inductor.scheduling import CuteDSLCombinedScheduling, CuteDSLScheduling
    from .runtime.wrapper import CuteDSLKernelWrapper
    from .template.buffer import CuteDSLTemplateBuffer
    from .template.caller import CuteDSLTemplateCaller
    from .template.kernel import CuteDSLTemplateKernel
    from .template.template import CuteDSLTemplate

    install()

__all__ = [
    "TESTED_TORCH",
    "__version__",
    "untested_torch",
    "CuteDSLCombinedScheduling",
    "CuteDSLKernelWrapper",
    "CuteDSLScheduling",
    "CuteDSLTemplate",
    "CuteDSLTemplateBuffer",
    "CuteDSLTemplateCaller",
    "CuteDSLTemplateKernel",
    "autotune_select_algorithm",
    "install",
]
