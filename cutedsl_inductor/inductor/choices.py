"""CuteDSLChoices: offers our built-in GEMM as choices for aten.mm, aten.addmm and
aten.bmm under max-autotune, next to ATen and Triton; with ``config.fp8`` our FP8 GEMM
for ``aten._scaled_mm`` too (``scaled_mm.py``).

Inductor's GEMM lowerings build their choice lists through
``V.choices.get_template_configs(kernel_inputs, templates, op_name)`` on every supported
torch; ``install_choices`` makes ``CuteDSLChoices`` Inductor's choices class
(``config.inductor_choices_class``), which appends our choices to that list when
``"CUTEDSL"`` is in ``max_autotune_gemm_backends`` and max-autotune is on.

A lowering may call ``get_template_configs`` several times (addmm: once for ATen with
the original bias, once for the other templates with the bias expanded to the output
shape); we offer our choices once per lowering, on the first call whose operands have
their final form (every input as many dims as the output).

Where Inductor's distributed autotuning spreads the mm nodes over the ranks and our
choices do not take part in it (``distributed.withheld_reason()``), the mm nodes get none
of ours, so torch's flow, which describes only its own choices, handles them alone.
"""

from __future__ import annotations

import functools
import logging
import weakref
from typing import Any

from torch._inductor import config as inductor_config
from torch._inductor.choices import InductorChoices
from torch._inductor.virtualized import V

from .. import config
from ..template.template import CPP_WRAPPER_UNSUPPORTED, cpp_wrapper_refused
from . import distributed, scaled_mm
from .cache_key import cutedsl_gemm_enabled, fingerprint

log = logging.getLogger(__name__)

GEMM_OPS = ("mm", "addmm", "bmm")
# graph -> (op name, input node ids) already offered in it
_OFFERED: "weakref.WeakKeyDictionary[Any, set[tuple[Any, ...]]]" = weakref.WeakKeyDictionary()


def _first_offer(op_name: str, nodes: list[Any]) -> bool:
    offered = _OFFERED.setdefault(V.graph, set())
    key = (op_name, *(id(node) for node in nodes))
    if key in offered:
        return False
    offered.add(key)
    return True


@functools.cache
def _warn_once(message: str) -> None:
    log.warning(message)


class CuteDSLChoices(InductorChoices):
    def uuid(self) -> Any:
        """Part of the FX graph cache key (torch 2.12 and 2.13 ask a choices class for
        it): None, as for no class, where the graph reaches nothing of ours."""
        return fingerprint("CuteDSLChoices")

    def get_template_configs(self, kernel_inputs: Any, templates: list[Any], op_name: str,
                             *args: Any, **kwargs: Any) -> list[Any]:
        choices = super().get_template_configs(kernel_inputs, templates, op_name, *args, **kwargs)
        scaled = op_name == scaled_mm.OP_NAME and config.fp8
        if not (op_name in GEMM_OPS or scaled) or not cutedsl_gemm_enabled():
            return choices
        withheld = distributed.withheld_reason() if op_name == "mm" else None
        if withheld is not None:
            _warn_once(f"no CuteDSL GEMM choices for the mm nodes: {withheld} "
                       "(docs/distributed.md)")
            return choices
        if cpp_wrapper_refused():
            _warn_once(f"no CuteDSL GEMM choices: {CPP_WRAPPER_UNSUPPORTED}")
            return choices
        try:  # lazily: the kernel's modules import cutlass, which may be missing or broken
            from ..kernels.gemm.template import gemm_choices
        except ImportError as err:  # no (usable) nvidia-cutlass-dsl: offer nothing
            _warn_once(f"CUTEDSL is in max_autotune_gemm_backends but CuTe DSL cannot be "
                       f"imported ({err}): no CuteDSL GEMM choices are offered")
            return choices
        nodes = kernel_inputs.nodes()
        layout = kernel_inputs.output_layout(flexible=False)
        if scaled:
            if _first_offer(op_name, nodes):
                scaled_mm.offer(choices, nodes, layout)
            return choices
        if any(len(node.get_size()) != len(layout.size) for node in nodes):
            return choices
        if not _first_offer(op_name, nodes):
            return choices
        scalars = {"alpha": 1.0, "beta": 0.0}
        if op_name == "addmm":
            scalars = {name: kernel_inputs.get_scalar(name) for name in scalars}
        gemm_choices(choices, op_name, nodes, layout, **scalars)
        return choices


def install_choices() -> None:
    current = inductor_config.inductor_choices_class
    if current is None:
        inductor_config.inductor_choices_class = CuteDSLChoices
    elif not (isinstance(current, type) and issubclass(current, CuteDSLChoices)):
        log.warning(
            "config.inductor_choices_class is already set (%r): CuteDSL GEMM choices are "
            "not offered unless that class derives from cutedsl_inductor's CuteDSLChoices",
            current,
        )
