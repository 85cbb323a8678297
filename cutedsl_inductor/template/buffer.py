"""CuteDSLTemplateBuffer: the IR node of a chosen CuteDSL template in Inductor's graph.

It is a ``TemplateBuffer`` of our own (not upstream's ``ir.CuteDSLTemplateBuffer``), so
Inductor's stock CUDA scheduling never claims it; ``CuteDSLCombinedScheduling`` routes it
to ``CuteDSLScheduling``. ``make_kernel_render(buffer)`` returns (kernel, render) for the
final code generation; ``template`` and ``params`` say which choice it is, ``prologue``
which producer of an input it computes in its load path, if any.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from torch._inductor import ir

from ..compile.records import Params


class CuteDSLTemplateBuffer(ir.TemplateBuffer):
    def __init__(
        self,
        layout: ir.Layout,
        inputs: Sequence[ir.IRNode],
        make_kernel_render: Any,
        template: Any,
        params: Params,
        mutated_inputs: Iterable[ir.IRNode] | None = None,
    ) -> None:
        super().__init__(layout, inputs, make_kernel_render)
        self.template = template
        self.params = params
        # the fused prologue (``template/prologue.py``), set where the scheduler fuses one
        self.prologue: Any = None
        self.outputs: list[ir.Buffer] = [self]
        if mutated_inputs is not None:
            device = self.inputs[0].get_device()
            self.outputs += [
                ir.MutationOutput(ir.NoneLayout(device=device), buf, self)
                for buf in mutated_inputs
            ]

    def get_outputs(self) -> list[ir.Buffer]:
        return self.outputs
