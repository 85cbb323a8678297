"""The layout constraint of ``cutedsl::sdpa`` and ``cutedsl::sdpa_backward``
(``install_sdpa`` registers it), in kind Inductor's own for its SDPA fallbacks
(``lowering.sdpa_constraint``): what ATen's kernels take, so that the choice an ATen
backend wins can run, with no copy where none is needed.

A tensor already laid out with a dense last dim and strides aligned to 8 elements stays
as it is; any other goes to its traced stride order where that has a dense last dim,
else contiguous. A bias keeps the dims it was traced broadcast in (stride 0: a mask
broadcast over heads is one (B, 1, Lq, Lk) buffer, which the forward and the backward
share), its rows aligned. A layout tag (``needs_fixed_stride_order``) would instead copy
a broadcast bias out in full, to an order that ranks its stride-0 dim innermost.
"""

from __future__ import annotations

from typing import Any

import sympy
import torch

_ALIGN = 8  # elements: the strides ATen's SDPA kernels take (a bias's rows included)


def _bias_strides(val: torch.Tensor) -> list[Any]:
    """A dense last dim, rows aligned to ``_ALIGN``, dims traced broadcast kept so."""
    from torch._inductor.virtualized import V
    from torch.utils._sympy.functions import CeilDiv

    sizes = [s.node.expr if isinstance(s, torch.SymInt) else sympy.Integer(s)
             for s in val.shape]
    strides, run = [sympy.Integer(1)], CeilDiv(sizes[-1], _ALIGN) * _ALIGN
    for i in range(val.dim() - 2, -1, -1):
        broadcast = V.graph.sizevars.statically_known_equals(val.stride(i), 0)
        strides.insert(0, sympy.Integer(0) if broadcast else run)
        run = run if broadcast else run * sizes[i]
    return strides


def constrain_inputs(fx_node: torch.fx.Node, *args: Any, **kwargs: Any
                     ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Both ops' inputs, as the module says; ``fx_node``: the op's node."""
    from torch._inductor import ir

    def constrain(name: str, arg: Any, fx_arg: Any) -> Any:
        val = fx_arg.meta.get("val") if isinstance(fx_arg, torch.fx.Node) else None
        if not isinstance(val, torch.Tensor) or not isinstance(arg, ir.IRNode):
            return arg
        if name == "bias":
            arg.realize()  # one buffer for the forward and the backward
            return ir.ExternKernel.require_exact_strides(arg, _bias_strides(val))
        if ir.is_aligned_realized_tensor(arg, _ALIGN):  # as it is: no copy
            return arg
        order = ir.get_stride_order(val.stride())
        if order[-1] != 0:
            order = list(reversed(range(val.dim())))
        return ir.ExternKernel.require_stride_order(arg, order)

    names = [a.name for a in fx_node.target._schema.arguments]
    return tuple(constrain(n, a, f) for n, a, f in zip(names, args, fx_node.args)), kwargs
