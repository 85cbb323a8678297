"""``autotune_select_algorithm`` that returns the chosen IR node on every supported torch
(2.11 returns the node; 2.13 returns ``(node, choice)``), so a lowering written once
works on both."""

from __future__ import annotations

from typing import Any


def autotune_select_algorithm(name: str, choices: list[Any], input_nodes: list[Any],
                              layout: Any, **kwargs: Any) -> Any:
    from torch._inductor import select_algorithm

    selected = select_algorithm.autotune_select_algorithm(name, choices, input_nodes, layout,
                                                          **kwargs)
    return selected[0] if isinstance(selected, tuple) else selected
