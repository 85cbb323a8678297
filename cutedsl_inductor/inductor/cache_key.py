"""Our part of Inductor's FX graph cache key: in the keys of the graphs our code reaches,
and in no other.

Inductor keys a compiled graph (and AOTAutograd a dynamo graph) by, among the rest, the
``uuid()`` of every custom pass and of the choices class, none of which is shown the
graph. ``install_cache_key`` wraps ``FxGraphHashDetails.__init__`` (what both caches hash,
on every supported torch) so that while it runs, ``reach(gm, example_inputs)`` says what
of ours can change the graph's code (``config.Reach``), each only on a CUDA graph:

* ``GEMM``: CUTEDSL is among the max-autotune GEMM backends and max-autotune is on;
* ``FLEX``: a flex_attention HOP is switched on (``flex.switched_on``);
* ``TEMPLATES``: an op has an Inductor lowering defined outside torch (a user's template
  or ``cutedsl::add`` may serve it);
* ``SDPA`` (and ``FLEX``: the choice set holds our flex kernels): ``config.sdpa`` is on,
  CUTEDSL listed, max-autotune on, and the graph calls ``scaled_dot_product_attention``
  or one of its ATen ops.

Each pass of ours and ``CuteDSLChoices`` answer ``uuid()`` with ``fingerprint``: where
the graph reaches something, a hash of our versions (this package's sources included:
generated modules import its kernels) and of the knobs that steer what it reaches
(``config.snapshot(reach)``); where it reaches nothing, what torch would key without the
package (the wrapped pass's uuid, or None). So importing the package, a knob or an upgrade
of ours changes no key of a CPU graph, nor of a CUDA graph that lists no CUTEDSL, switches
on no flex and calls no custom lowering. A uuid asked
for outside a keying counts everything as reached. Torch 2.11's config keys the choices class by its name (no
``uuid``): there importing changes every key once, and nothing of ours changes it again.
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import json
from typing import Any

import torch
from torch._inductor import config as inductor_config
from torch.utils._pytree import tree_leaves

from .. import config
from ..compile import versions
from ..config import Reach
from .flex import switched_on

# what the graph being keyed reaches, in the FxGraphHashDetails being built
_KEYING: contextvars.ContextVar[Reach | None] = contextvars.ContextVar("cutedsl_keying",
                                                                      default=None)


def cutedsl_gemm_listed() -> bool:
    """CUTEDSL is among Inductor's GEMM backends (max-autotune may be off)."""
    backends = [b.strip() for b in inductor_config.max_autotune_gemm_backends.upper().split(",")]
    return "CUTEDSL" in backends


def cutedsl_gemm_enabled() -> bool:
    return cutedsl_gemm_listed() and bool(
        inductor_config.max_autotune or inductor_config.max_autotune_gemm
    )


def sdpa_choice_enabled() -> bool:
    """``config.sdpa``'s choice set applies: the knob, CUTEDSL listed, max-autotune on."""
    return config.sdpa and cutedsl_gemm_listed() and bool(inductor_config.max_autotune)


def _on_cuda(gm: torch.fx.GraphModule, example_inputs: Any) -> bool:
    values = [*example_inputs] + [node.meta.get(key) for module in gm.modules()
                                  if isinstance(module, torch.fx.GraphModule)
                                  for node in module.graph.nodes for key in ("val", "example_value")]
    return any(isinstance(leaf, torch.Tensor) and leaf.device.type == "cuda"
               for leaf in tree_leaves(values))


def _custom_lowering(target: Any) -> bool:
    """``target`` (an op) has an Inductor lowering defined outside torch."""
    from torch._inductor.lowering import lowerings

    if isinstance(target, torch._ops.OpOverloadPacket):
        overloads = [getattr(target, name) for name in target.overloads()]
    elif isinstance(target, torch._ops.OpOverload):
        overloads = [target]
    else:
        return False
    modules = [getattr(lowerings.get(op), "__module__", None) for op in overloads]
    return any(m is not None and m.split(".")[0] != "torch" for m in modules)


def _sdpa(target: Any) -> bool:
    """``target`` is SDPA: the functional (a dynamo graph) or an ATen op of it."""
    if target is torch._C._nn.scaled_dot_product_attention:
        return True
    name = getattr(getattr(target, "_schema", None), "name", "")
    return name.startswith("aten::_scaled_dot_product_")


def reach(gm: torch.fx.GraphModule, example_inputs: Any) -> Reach:
    """What of ours can change the code compiled for ``gm``."""
    if not _on_cuda(gm, example_inputs):
        return Reach(0)
    found = Reach.GEMM if cutedsl_gemm_enabled() else Reach(0)
    sdpa_choice = sdpa_choice_enabled()
    for module in gm.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for node in module.graph.nodes:
            if node.op != "call_function":
                continue
            if switched_on(node):
                found |= Reach.FLEX
            elif sdpa_choice and _sdpa(node.target):
                found |= Reach.SDPA | Reach.FLEX
            elif _custom_lowering(node.target):
                found |= Reach.TEMPLATES
    return found


def fingerprint(name: str, wrapped: Any = None) -> Any:
    """A uuid for our ``name`` chained to a ``wrapped`` pass's uuid: ``wrapped`` alone
    where the graph being keyed reaches nothing of ours."""
    reached = _KEYING.get()
    reached = Reach.ALL if reached is None else reached
    if not reached:
        return wrapped
    material = {"versions": versions.toolchain_versions(), "config": config.snapshot(reached),
                "reach": reached.value, "name": name, "wrapped": wrapped}
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()


def install_cache_key() -> None:
    from torch._inductor.codecache import FxGraphHashDetails

    init = FxGraphHashDetails.__init__
    if getattr(init, "_cutedsl_keying", False):
        return

    @functools.wraps(init)
    def keying(self: Any, gm: Any, example_inputs: Any, *args: Any, **kwargs: Any) -> None:
        token = _KEYING.set(reach(gm, example_inputs) if gm is not None else Reach.ALL)
        try:
            init(self, gm, example_inputs, *args, **kwargs)
        finally:
            _KEYING.reset(token)

    keying._cutedsl_keying = True  # type: ignore[attr-defined]
    FxGraphHashDetails.__init__ = keying  # type: ignore[method-assign]
