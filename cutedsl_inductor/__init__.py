"""cutedsl_inductor: CuTe DSL templates as autotuning choices inside torch.compile.

Importing the package registers its scheduling, choices and passes in Inductor
(``inductor/install.py``). The pipeline, one subpackage per stage, each importing only
from those below it: ``compile`` (specs, compile once, disk and remote caches) ->
``runtime`` (load and launch) -> ``autotune`` (benchmark requests, retiming) ->
``template`` (Jinja2 template -> choice) -> ``kernels`` (the built-in templates) ->
``inductor`` (scheduling, output code, passes); ``docs/architecture.md`` has the whole.

It imports private Inductor names, which change between torch releases: importing it
under a torch outside ``TESTED_TORCH`` (pyproject's range) warns once (``version.py``).
"""

import warnings

import torch

from .version import TESTED_TORCH, __version__, untested_torch

if (_untested := untested_torch(torch.__version__)) is not None:
    warnings.warn(_untested, stacklevel=1)

# after the check: under an untested torch these imports are what may fail
from .autotune.select import autotune_select_algorithm  # noqa: E402
from .compile import artifacts as _artifacts  # noqa: E402,F401  (registers our cache artifacts)
from .inductor.install import install  # noqa: E402
from .inductor.scheduling import CuteDSLCombinedScheduling, CuteDSLScheduling  # noqa: E402
from .runtime.wrapper import CuteDSLKernelWrapper  # noqa: E402
from .template.buffer import CuteDSLTemplateBuffer  # noqa: E402
from .template.caller import CuteDSLTemplateCaller  # noqa: E402
from .template.kernel import CuteDSLTemplateKernel  # noqa: E402
from .template.template import CuteDSLTemplate  # noqa: E402

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
