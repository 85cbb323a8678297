"""cutedsl_inductor: CuTe DSL templates as autotuning choices inside torch.compile.

Importing the package registers its scheduling for CUDA in Inductor. Pipeline, one
subpackage per stage: ``template`` (Jinja2 template -> choice) -> ``inductor`` (IR node,
scheduling, output code) -> ``compile`` (specs, compile-once, disk cache) -> ``runtime``
(load and launch) ; built-in templates live in ``templates``.

It imports private Inductor names, which change between torch releases: importing it
under a torch outside ``TESTED_TORCH`` (pyproject's range) warns once.
"""

import re
import warnings

import torch

__version__ = "0.1.0"

# torch >= the first, < the second (tested on 2.11, 2.12 and 2.13)
TESTED_TORCH = ((2, 11), (2, 14))


def untested_torch(version: str) -> str | None:
    """What to warn about a torch ``version`` outside ``TESTED_TORCH``, else None."""
    low, high = TESTED_TORCH
    found = re.match(r"(\d+)\.(\d+)", version)
    if found and low <= (int(found[1]), int(found[2])) < high:
        return None
    return (f"cutedsl_inductor was tested with torch >={low[0]}.{low[1]},<{high[0]}.{high[1]} "
            f"and this is torch {version}: it relies on private Inductor code that changes "
            "between releases, so compiling with it may fail")


if (_untested := untested_torch(torch.__version__)) is not None:
    warnings.warn(_untested, stacklevel=1)

# after the check: under an untested torch these imports are what may fail
from .autotune.select import autotune_select_algorithm  # noqa: E402
from .compile import artifacts as _artifacts  # noqa: E402,F401  (registers our cache artifacts)
from .inductor.ir import CuteDSLTemplateBuffer  # noqa: E402
from .inductor.scheduling import (  # noqa: E402
    CuteDSLCombinedScheduling, CuteDSLScheduling, install)
from .runtime.wrapper import CuteDSLKernelWrapper  # noqa: E402
from .template.caller import CuteDSLTemplateCaller  # noqa: E402
from .template.kernel import CuteDSLTemplateKernel  # noqa: E402
from .template.template import CuteDSLTemplate  # noqa: E402

install()

__all__ = [
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
