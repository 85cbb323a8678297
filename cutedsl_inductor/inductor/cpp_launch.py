"""Our chosen kernels in Inductor's C++ wrapper (cpp_wrapper, AOTInductor; with
``config.aot``): the code generation side of ``cpp_runtime.py``.

Per wrapper, once: ``CPP_RUNTIME`` and the runtime libraries' table. Per kernel, once: its
exported library (``compile/exported.py``) staged as a file, and a definition::

    static cutedsl_aot::Kernel cutedsl_<template>_<hash>_cpp{"<file>", "__tvm_ffi_cutedsl_<key>"};

Per call, one statement, so that the temporary handles of reinterpreted views live
through the launch::

    cutedsl_aot::launch(<kernel>, cutedsl_runtime, <folder>, <stream>,
                        {cutedsl_aot::tensor(buf0, 4, 16), ..., cutedsl_aot::scalar(s0)});

The statement is a wrapper line (``_LaunchLine``) that becomes code in order with
Inductor's own kernel calls, so whichever comes first declares the stream.
``<folder>`` is the model's ``cubin_dir_`` under AOTInductor (the package's extracted
folder, where it has one) and ``std::nullopt`` under cpp_wrapper: files are then found
by their absolute paths. torch 2.14's AOTInductor also writes a JIT entry (its "dual
wrapper mode", where the graph has a Triton device), which runs before packaging: there
the launch takes cpp_wrapper's stream and folder, in ``run_impl`` AOTI's. Under
AOTInductor every staged file joins the wrapper's ``additional_files``, which the
packager copies into the model's folder.

Failure semantics: a kernel that does not export here raises ``NotExportableError`` and
the compile fails; autotuning refuses such choices first (``template/caller.py``) and a
fusion whose kernel does not export is not made (``scheduling.py``).
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Sequence
from typing import Any

from torch._inductor.codegen.wrapper import WrapperLine
from torch._inductor import utils as torch_utils
from torch._inductor.utils import get_kernel_metadata
from torch._inductor.virtualized import V

from ..compile.exported import DLPACK_DTYPES, runtime, staged, staged_runtime
from ..compile.records import KernelSource
from ..compile.specs import ArgSpec, ScalarSpec
from ..runtime.loader import load_exported, write_source
from .cpp_runtime import CPP_RUNTIME


@dataclasses.dataclass
class _WrapperState:
    kernels: dict[str, str] = dataclasses.field(default_factory=dict)  # key -> C++ name


_STATES: "weakref.WeakKeyDictionary[Any, _WrapperState]" = weakref.WeakKeyDictionary()


def _ship(wrapper: Any, path: Any) -> str:
    if V.graph.aot_mode and str(path) not in wrapper.additional_files:
        wrapper.additional_files.append(str(path))
    return str(path)


def _state(wrapper: Any) -> _WrapperState:
    state = _STATES.get(wrapper)
    if state is None:
        state = _STATES[wrapper] = _WrapperState()
        libraries = ", ".join(f'{{"{lib.soname}", "{_ship(wrapper, staged_runtime(lib))}"}}'
                              for lib in runtime())
        wrapper.header.splice(CPP_RUNTIME)
        wrapper.header.writeline(
            f"static const cutedsl_aot::Library cutedsl_runtime[] = {{{libraries}}};")
    return state


def define_kernel(kernel: KernelSource, node_schedule: list[Any]) -> str:
    """The C++ name of ``kernel``'s definition in V.graph's C++ wrapper (written on its
    first use)."""
    wrapper = V.graph.wrapper_code
    exported = load_exported(kernel)
    kernel_name = kernel.name
    state = _state(wrapper)
    name = state.kernels.get(exported.key)
    if name is not None:
        return name
    name = state.kernels[exported.key] = f"{kernel_name}_cpp"
    path = _ship(wrapper, staged(exported.file_name, exported.library))
    origins, _ = get_kernel_metadata(node_schedule, wrapper)
    wrapper.header.writeline(f"// CuteDSL kernel {kernel_name}: {write_source(kernel.source)[1]}")
    for line in origins.splitlines():
        wrapper.header.writeline(line.replace("#", "//", 1))
    wrapper.header.writeline(
        f'static cutedsl_aot::Kernel {name}{{"{path}", "{exported.symbol}"}};')
    return name


def generate_call(name: str, nodes: list[Any], references: list[str],
                  specs: Sequence[ArgSpec], device: Any) -> None:
    """The launch of kernel ``name`` with the entry's arguments (``nodes``, passed as
    ``references``; ``specs`` their dtypes) on ``device``'s current stream."""
    from torch._inductor.codegen.cpp_utils import cexpr

    wrapper = V.graph.wrapper_code
    args = []
    for node, reference, spec in zip(nodes, references, specs, strict=True):
        if isinstance(spec, ScalarSpec):
            args.append(f"cutedsl_aot::scalar({cexpr(V.graph.sizevars.simplify(node))})")
        else:
            code, bits = DLPACK_DTYPES[spec.dtype]
            args.append(f"cutedsl_aot::tensor({reference}, {code}, {bits})")
    wrapper.writeline(_LaunchLine(wrapper, name, tuple(args), device.index, V.graph.name))


def _dual(wrapper: Any) -> bool:
    """Whether ``wrapper`` writes a JIT entry beside AOTI's ``run_impl`` (torch 2.14's
    AOTInductor where the graph has a Triton device; its buffers then write both)."""
    return isinstance(wrapper.wrapper_call, getattr(torch_utils, "DualIndentedBuffer", ()))


@dataclasses.dataclass(frozen=True)
class _LaunchLine(WrapperLine):
    """One launch, written when the wrapper turns its lines into code, as Inductor's own
    kernel calls are (``KernelCallLine``): the wrapper declares a device's stream
    (``cudaStream_t stream0; ...``) where its first ``write_get_raw_stream`` happens and
    then only names it (cached per device and graph). Asked for here, at scheduling, our
    declaration would land at our launch, after a Triton kernel earlier in the graph had
    already named ``stream0`` when its deferred line became code (issue #66). In dual
    wrapper mode the launch is written twice: to the JIT entry and to ``run_impl``."""

    wrapper: Any
    name: str
    args: tuple[str, ...]
    device_index: int
    graph_name: str

    def _launch(self, stream: str, folder: str) -> str:
        return (f"cutedsl_aot::launch({self.name}, cutedsl_runtime, {folder}, {stream}, "
                f"{{{', '.join(self.args)}}});")

    def codegen(self, code: Any) -> None:
        aot = self._launch("stream", "this->cubin_dir_")
        if V.graph.aot_mode and not _dual(self.wrapper):
            code.writeline(aot)
            return
        jit = self._launch(self.wrapper.write_get_raw_stream(self.device_index,
                                                              self.graph_name), "std::nullopt")
        if V.graph.aot_mode:
            code.writeline_jit(jit)
            code.writeline_aot(aot)
        else:
            code.writeline(jit)
