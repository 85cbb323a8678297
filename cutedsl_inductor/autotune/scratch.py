"""A scratch Inductor graph for generating template choices outside torch.compile
(precompile, demo without a GPU): real IR nodes on a CUDA device object, no GPU needed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.fx
from torch._inductor import ir
from torch._inductor.graph import GraphLowering
from torch._inductor.virtualized import V


class ScratchGraph:
    def __init__(self, graph: GraphLowering) -> None:
        self.graph = graph

    def input(self, shape: Sequence[int], dtype: torch.dtype,
              stride: Sequence[int] | None = None) -> Any:
        name = f"arg{len(self.graph.graph_inputs)}_1"
        layout = ir.FixedLayout(torch.device("cuda", 0), dtype, list(shape),
                                stride=list(stride) if stride is not None else None)
        node = ir.TensorBox.create(ir.InputBuffer(name=name, layout=layout))
        self.graph.graph_inputs[name] = node
        return node


@contextlib.contextmanager
def scratch_graph() -> Iterator[ScratchGraph]:
    graph = GraphLowering(torch.fx.symbolic_trace(lambda x: x))
    with V.set_graph_handler(graph):
        yield ScratchGraph(graph)
