"""The built-in templates, in one place: what ``precompile`` offers (and ``precompile
--templates`` accepts) and what a compile worker's zygote imports ahead of every build.

Modules are named, not imported: this module sits below every layer (the zygote, in
``runtime``, reads it, and a kernel module imports CuTe DSL, seconds of CPU), and the
command line reads the names without importing torch. A template's module offers
``precompile_choices(scratch)``, or ``precompile_choices(scratch, shapes)`` where
``takes_shapes`` (the GEMM's, for ``--gemm-shapes``).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class BuiltinTemplate:
    name: str  # precompile --templates
    module: str  # offers precompile_choices
    takes_shapes: bool = False  # precompile_choices(scratch, [(M, N, K), ...])
    # what the modules it generates import (a compile worker imports them once, ahead)
    preload: tuple[str, ...] = ()


BUILTIN_TEMPLATES: dict[str, BuiltinTemplate] = {template.name: template for template in (
    BuiltinTemplate("elementwise", "cutedsl_inductor.kernels.elementwise"),
    BuiltinTemplate("gemm", "cutedsl_inductor.kernels.gemm.template", takes_shapes=True,
                    preload=("cutedsl_inductor.kernels.gemm.sm90_gemm",
                             "cutedsl_inductor.kernels.gemm.views")),
)}
