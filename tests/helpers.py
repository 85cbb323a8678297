"""IR builders for CPU tests: real Inductor nodes on a (virtual) CUDA device."""

import torch


def make_input(graph, name, shape, dtype=torch.float32, stride=None, offset=0):
    from torch._inductor import ir

    layout = ir.FixedLayout(torch.device("cuda", 0), dtype, list(shape),
                            stride=list(stride) if stride else None, offset=offset)
    node = ir.TensorBox.create(ir.InputBuffer(name=name, layout=layout))
    graph.graph_inputs[name] = node
    return node


def make_layout(shape, dtype=torch.float32):
    from torch._inductor import ir

    return ir.FixedLayout(torch.device("cuda", 0), dtype, list(shape))
