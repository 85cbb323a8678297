"""Readers of FX nodes that our graph passes share (``sdpa_pass.py``, ``swiglu_pass.py``)."""

from __future__ import annotations

from typing import Any

import torch


def bound(node: torch.fx.Node) -> dict[str, Any]:
    """An op call's arguments by their schema names, defaults filled in (None where the
    schema has none)."""
    values = {}
    for i, arg in enumerate(node.target._schema.arguments):
        if i < len(node.args):
            values[arg.name] = node.args[i]
        elif arg.name in node.kwargs:
            values[arg.name] = node.kwargs[arg.name]
        else:
            values[arg.name] = arg.default_value if arg.has_default_value() else None
    return values
