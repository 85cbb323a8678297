"""cutedsl_inductor: CuTe DSL templates as autotuning choices inside torch.compile.

Importing the package registers its scheduling for CUDA in Inductor. Pipeline, one
subpackage per stage: ``template`` (Jinja2 template -> choice) -> ``inductor`` (IR node,
scheduling, output code) -> ``compile`` (specs, compile-once, disk cache) -> ``runtime``
(load and launch) ; built-in templates live in ``templates``.
"""

__version__ = "0.1.0"

from .autotune.select import autotune_select_algorithm
from .compile import artifacts as _artifacts  # registers our type of cache artifact
from .inductor.ir import CuteDSLTemplateBuffer
from .inductor.scheduling import CuteDSLCombinedScheduling, CuteDSLScheduling, install
from .runtime.wrapper import CuteDSLKernelWrapper
from .template.caller import CuteDSLTemplateCaller
from .template.kernel import CuteDSLTemplateKernel
from .template.template import CuteDSLTemplate

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
