"""Our GEMM choices in Inductor's distributed autotuning.

With ``torch._inductor.config.distributed_max_autotune_gemm`` (env
``TORCHINDUCTOR_DISTRIBUTED_MAX_AUTOTUNE_GEMM=1``) and torch.distributed initialized, the
ranks of a job, each compiling the same graph, split its mm nodes: rank r autotunes the
nodes whose index modulo the world size is r and lowers the others to placeholders;
before fusion the ranks all-gather their winners and each rebuilds its placeholders from
them (``torch._inductor.distributed_autotune``). Torch describes only its own choices
(ATen's mm and its Triton mm template, read back from their text descriptions), and it
looks for this rank's winners among the nodes still deferred, which our pre-fusion step
would have finalized already.

With ``config.distributed_autotune`` our choices take part (``take_part()``):

* a winner of ours travels as a ``SerializedCuteDSLChoice``, a subclass of torch's
  serialized choice (its gather and its rebuild take it) that holds a
  ``ChoiceDescription``: template name, parameters, workspace, the argument specs' key and
  the kernel's name, which hashes its rendered source and specs. The rank receiving it
  renders the template with those parameters on its own input nodes of that mm: the same
  name must come out, hence the same compile key, so the kernel loads from the kernel
  cache where the deciding rank stored it while autotuning (the disk cache on one machine;
  the Redis tier across machines: a fetch), or compiles where it is not stored yet (on one
  machine one rank at a time, under the disk cache's entry lock; the others load it);
* ``multi_template.distributed_schedule``, installed over torch's step, runs our pre-fusion
  step first and then sends for each node this rank autotuned the choice the node ends
  with (``local_results``: ours as finalized, with its epilogue timing; else Inductor's
  fastest), so every rank runs the same kernel for it.

Off, or where torch's module is not the one read here (``supported()``: torch 2.12's and
2.13's), our choices are not offered to the mm nodes Inductor distributes
(``withheld_reason()``), and torch's own flow handles those alone.

Failure semantics: a description that does not rebuild here (its template not registered,
another kernel name: the ranks differ in torch, this package or its knobs) raises
``DistributedChoiceError`` and stops the compile, since this rank never timed that node
and has no choice to fall back on; a rank whose deferred nodes are not the ones its
lowering announced raises ``DistributedAutotuneError`` (where torch asserts).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch.distributed as dist
from torch._inductor import config as inductor_config
from torch._inductor import ir
from torch._inductor.scheduler import SchedulerNode
from torch._inductor.virtualized import V

from .. import config
from ..compile.records import Params
from ..compile.specs import Workspace, specs_key
from ..exc import DistributedAutotuneError, DistributedChoiceError, format_params
from ..template.caller import CuteDSLTemplateCaller
from ..template.template import CuteDSLTemplate

try:
    from torch._inductor import distributed_autotune as torch_distributed
except ImportError:  # a torch without distributed autotuning
    torch_distributed = None

# what this module uses of torch's
_API = ("schedule", "_sync", "_autotune_remote_nodes", "_SerializedChoice",
        "_DistributedAutotuneBuffer", "_DISTRIBUTED_AUTOTUNE_KEY")


def supported() -> bool:
    """Torch's distributed autotuning is the one this module takes part in."""
    return (torch_distributed is not None
            and all(hasattr(torch_distributed, name) for name in _API)
            and hasattr(inductor_config, "distributed_max_autotune_gemm")
            and hasattr(V, "distributed_autotune_state"))


def inductor_distributes() -> bool:
    """Inductor splits this compile's mm autotuning between the ranks."""
    return (bool(getattr(inductor_config, "distributed_max_autotune_gemm", False))
            and dist.is_available() and dist.is_initialized())


def take_part() -> bool:
    return inductor_distributes() and config.distributed_autotune and supported()


def withheld_reason() -> str | None:
    """Why our choices are not offered to the mm nodes Inductor distributes, or None."""
    if not inductor_distributes() or take_part():
        return None
    if not config.distributed_autotune:
        return ("Inductor's distributed autotuning is on and cutedsl_inductor.config."
                "distributed_autotune (CUTEDSL_INDUCTOR_DISTRIBUTED_AUTOTUNE=1) is off")
    return ("Inductor's distributed autotuning is on and this torch's "
            "torch._inductor.distributed_autotune is not the one cutedsl_inductor "
            "takes part in (torch 2.12 and 2.13's)")


@dataclasses.dataclass(frozen=True)
class ChoiceDescription:
    """One of our choices as another rank rebuilds it on its own nodes of the same op."""

    kernel: str  # cutedsl_<template>_<hash of the rendered source and the specs>
    template: str
    params: Params
    specs: str  # ``specs_key`` of the entry's arguments
    workspace: Workspace | None

    @staticmethod
    def of(choice: CuteDSLTemplateCaller) -> "ChoiceDescription":
        return ChoiceDescription(choice.name, choice.template.name,
                                 choice.params, specs_key(choice.specs),
                                 choice.workspace)

    def rebuild(self, input_nodes: list[Any], layout: ir.Layout) -> CuteDSLTemplateCaller:
        """The choice on ``input_nodes`` and ``layout``, which must render the same kernel."""
        template = CuteDSLTemplate.all_templates.get(self.template)
        if template is None:
            raise self.error("no template of that name is registered on this rank")
        try:
            choice = template.generate(input_nodes=list(input_nodes), layout=layout,
                                       workspace=self.workspace, **self.params)
        except Exception as err:
            raise self.error(f"{type(err).__name__}: {err}") from err
        if choice.name != self.kernel:
            differing = ("argument specs" if specs_key(choice.specs) != self.specs
                         else "rendered source")
            raise self.error(f"it renders as {choice.name} here: its {differing} differ")
        return choice

    def error(self, cause: str) -> DistributedChoiceError:
        return DistributedChoiceError(kernel=self.kernel, template=self.template,
                                      params=format_params(self.params), cause=cause)


_SerializedChoice = torch_distributed._SerializedChoice if supported() else object


class SerializedCuteDSLChoice(_SerializedChoice):  # type: ignore[misc,valid-type]
    """Torch's all-gathered record of the winner of node ``index``, for a choice of ours
    (torch's constructor reads only its own kinds of choice, so it is not called)."""

    def __init__(self, index: int, description: ChoiceDescription) -> None:
        self.index = index
        self.description = description

    def get_choice(self, layout: ir.Layout, inputs: Any) -> CuteDSLTemplateCaller:
        return self.description.rebuild(inputs.nodes(), layout)


def serialized(index: int, choice: Any) -> Any:
    """The record torch gathers for ``choice``, the winner of node ``index``."""
    if isinstance(choice, CuteDSLTemplateCaller):
        return SerializedCuteDSLChoice(index, ChoiceDescription.of(choice))
    return torch_distributed._SerializedChoice(index, choice)


def local_results(nodes: list[Any], finalized: dict[str, CuteDSLTemplateCaller]) -> list[Any]:
    """What this rank sends: for each node it autotunes, the choice the node ends with --
    ``finalized`` (buffer name -> our choice, as our pre-fusion step left it), else the
    deferred node's fastest."""
    results = []
    for node in nodes:
        index = _local_index(node, finalized)
        if index is not None:
            choice = finalized.get(node.node.get_name()) or node.node.get_min_choice()[0]
            results.append(serialized(index, choice))
    expected = V.distributed_autotune_state.autotuned_local_count
    if len(results) != expected:
        raise DistributedAutotuneError(
            expected=expected, found=len(results),
            detail="each must still be deferred when the ranks exchange their winners: "
                   "keep torch._inductor.config.benchmark_epilogue_fusion on")
    return results


def exchange(scheduler: Any, results: list[Any]) -> None:
    """Torch's all-gather of the ranks' results and its rebuild of this rank's
    placeholders from them."""
    torch_distributed._autotune_remote_nodes(scheduler, torch_distributed._sync(results))


def _local_index(node: Any, finalized: dict[str, Any]) -> int | None:
    """The distributed-autotuning index of ``node`` if this rank autotunes it."""
    if not isinstance(node, SchedulerNode):
        return None
    buffer = node.node
    if isinstance(buffer, torch_distributed._DistributedAutotuneBuffer):
        return None
    if not (isinstance(buffer, ir.MultiTemplateBuffer) or buffer.get_name() in finalized):
        return None
    origin = buffer.origin_node
    info = (origin.meta.get(torch_distributed._DISTRIBUTED_AUTOTUNE_KEY)
            if origin is not None else None)
    return info.index if info is not None and info.local else None
