"""Error classes. Each has a templated message that names what a user needs to act:
the template, the choice's parameters and the generated file where there is one.

Raise them with keyword arguments: ``raise TemplateRenderError(template="my_add",
params={"THREADS": 128}, path=None, cause=err)``; ``str(err)`` is the filled template.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class CuteDSLInductorError(Exception):
    """Base class: ``message`` is a ``str.format`` template over the keyword arguments."""

    message = "{detail}"

    def __init__(self, **fields: Any) -> None:
        self.fields = fields
        super().__init__(self.message.format(**fields))

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.fields))


def _rebuild(cls: type[CuteDSLInductorError], fields: dict[str, Any]) -> CuteDSLInductorError:
    return cls(**fields)


def format_params(params: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in params.items()) or "(no parameters)"


class RecordError(CuteDSLInductorError, ValueError):
    """A typed record (``compile/records.py``, ``kernels/gemm/problem.py``) refuses a
    field's value at construction."""

    message = "{record}: {field}={value!r} is refused: {reason}"


class TemplateRegistryError(CuteDSLInductorError):
    message = (
        "CuteDSL template name {name!r} is already registered with a different source. "
        "Template names are global: pick another name, or pass the same source."
    )


class TemplateNameError(CuteDSLInductorError, ValueError):
    message = (
        "CuteDSL template name {name!r} is refused: it goes into its kernels' names (Python "
        "functions, then symbols of the compiled code), so it must be an ASCII Python "
        "identifier (letters A-Z and a-z, digits and _, not starting with a digit)"
    )


class TemplateRenderError(CuteDSLInductorError):
    message = (
        "CuteDSL template {template!r} failed to render with parameters [{params}]: "
        "{cause}"
    )


class SubgraphError(TemplateRenderError):
    """A ``{{modification(...)}}`` hook cannot render its subgraph (``template/subgraph.py``):
    the choice is refused with the reason."""

    message = (
        "CuteDSL template {template!r} with parameters [{params}] cannot render subgraph "
        "{subgraph} as CuTe DSL, so the choice is refused: {cause}"
    )


class ChoiceError(CuteDSLInductorError):
    message = (
        "CuteDSL template {template!r} could not make a choice with parameters "
        "[{params}]: {cause}"
    )


class GeneratedCodeError(CuteDSLInductorError):
    message = (
        "CuteDSL template {template!r} with parameters [{params}] rendered invalid "
        "Python ({cause}); generated file: {path}"
    )


class KernelCompileError(CuteDSLInductorError):
    message = (
        "CuteDSL kernel {kernel!r} (template {template!r}, parameters [{params}]) failed "
        "to compile for {arch}: {cause}; generated file: {path}"
    )


class CompileWorkerError(CuteDSLInductorError):
    message = (
        "the worker process compiling CuteDSL kernel {kernel!r} (template {template!r}, "
        "parameters [{params}]) died: {cause}"
    )


class KernelArgumentError(CuteDSLInductorError):
    message = (
        "CuteDSL kernel {kernel!r} (template {template!r}) was called with arguments that "
        "do not match what it was compiled for.\n  expected: {expected}\n  got:      "
        "{got}\n  cause: {cause}\n  generated file: {path}"
    )


class NotExportableError(CuteDSLInductorError):
    """A kernel Inductor's C++ wrapper cannot launch (``compile/exported.py``): the choice
    is refused at autotuning, a fusion is not made."""

    message = (
        "CuteDSL kernel {kernel!r} (template {template!r}) cannot be launched by Inductor's "
        "C++ wrapper (cpp_wrapper, AOTInductor): {reason}"
    )


class DistributedChoiceError(CuteDSLInductorError):
    """A winner of ours that another rank chose in Inductor's distributed autotuning does
    not rebuild on this rank (``inductor/distributed.py``); this rank never timed that
    node, so it has no other choice to fall back on."""

    message = (
        "CuteDSL choice {kernel!r} (template {template!r}, parameters [{params}]), chosen "
        "by another rank in Inductor's distributed autotuning, cannot be rebuilt on this "
        "rank: {cause}. Every rank must run the same torch, cutedsl_inductor and knobs "
        "(docs/distributed.md)"
    )


class DistributedAutotuneError(CuteDSLInductorError):
    """This rank's share of Inductor's distributed autotuning is not what its lowering
    announced (``inductor/distributed.py``)."""

    message = (
        "Inductor's distributed autotuning: this rank lowered {expected} node(s) to "
        "autotune but found {found} to send to the other ranks ({detail})"
    )


class CacheEntryError(CuteDSLInductorError):
    """An on-disk cache entry is unusable (damaged, forged or foreign); it is rebuilt."""

    message = "cache entry {path} is unusable: {reason}"


class PortableEntryError(CuteDSLInductorError):
    """A kernel or tuning decision from the remote cache or a cache artifact does not
    verify (``compile/cache/portable.py``); it is not used."""

    message = "{source} entry {key} refused: {reason}"


class ConfigError(CuteDSLInductorError, ValueError):
    """A knob's value (an environment variable, an assignment, a command-line option) is
    refused."""

    message = "{variable}={value!r} is not accepted: expected {accepted}"


class UnknownKnobError(ConfigError):
    """An assignment (or ``config.patch``) names no knob."""

    message = ("cutedsl_inductor.config has no knob {name!r}{hint}; "
               "docs/configuration.md lists them")


class CheckTargetError(CuteDSLInductorError):
    """``cutedsl-inductor check FILE.py:NAME`` names no template it can load."""

    message = "{target!r}: {cause} (expected FILE.py:NAME, NAME a CuteDSLTemplate in FILE.py)"
