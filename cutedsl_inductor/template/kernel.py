"""CuteDSLTemplateKernel: renders one template choice into a CuTe DSL Python module.

The Jinja2 template sees these hooks (names as in upstream PyTorch):
  ``{{kernel_name}}``           the kernel's unique name (prefix your functions with it)
  ``{{def_kernel("a", "b")}}``  the entry point ``def <kernel_name>_<suffix>(a, b, <out>,
                                <extra args>, stream):`` -- ``suffix`` is
                                ``config.entry_suffix`` ("main" by default). Put
                                ``@cute.jit`` on the line above to make the entry itself
                                a CuTe function: it is then compiled once, with TVM-FFI,
                                and launched straight from torch tensors (fast path).
                                Without it the entry is plain Python called with torch
                                tensors and the stream (upstream style).
  ``{{input_nodes}}``, ``{{output_node}}``  the IR nodes
  ``{{gen_defines()}}``         the choice's parameters as ``NAME: cutlass.Constexpr = v``,
                                one per line, at the indentation of the line it is on
  ``{{get_output()}}``          the entry's name for the output tensor
  ``{{get_workspace()}}``       the entry's name for the choice's scratch buffer (a 1-D
                                tensor after the output, made for each call, zeroed where
                                asked: ``workspace=`` of ``generate``, a ``Workspace``)
  ``{{size("a", 0)}}``, ``{{stride("a", 1)}}``  sizes/strides as Python expressions
                                (an int, or Inductor's symbol for dynamic shapes)
  ``{{def_epilogue()}}``        defines ``<kernel_name>_epilogue(value, c0, .., extras)``:
                                call it on each fp32 output value with the element's
                                coordinates (outermost first) before the store; it applies
                                the fused pointwise epilogue (identity when none); also
                                its load and apply phases (see ``template/epilogue.py``)
  ``{{epilogue_inputs()}}``     the ``extras`` tuple to pass it, built in the entry
  ``{{epilogue_tile_input()}}`` the entry's name for the epilogue input laid out like the
                                output (``tile_input_index``: its ``loaded`` fragment, or
                                None); ``{{def_epilogue(tile_input=True)}}`` then leaves
                                its loads out of the pair loads: the template fills it
  ``{{modification(0, "out", score="s", b="b", h="h", m="q", n="kv")}}``  statements
                                computing subgraph 0 (``subgraphs=`` of ``generate``) into
                                ``out``, its placeholders read from the template's
                                expressions, captured tensors from ``captures``
                                (``template/subgraph.py``); ``mask=`` and
                                ``input_dtypes=`` as there; ``None`` for ``out``:
                                the subgraph's scatter stores, as fp32 atomic adds
  ``{{def_prologue("a")}}``     defines ``<kernel_name>_prologue(value, c0, .., extras)``:
                                call it on each element of input ``a`` the template loads
                                (fp32, with its coordinates); it applies the fused
                                prologue, whose source the entry then gets as ``a``
                                (identity when none; ``template/prologue.py``)
  ``{{prologue_inputs()}}``     the ``extras`` tuple to pass it, built in the entry
  ``{{modification_inputs()}}`` the ``captures`` tuple (flat views of the captured tensors
                                every modification reads), built in the entry

Invariants: rendering is pure (no global counters); the same template, parameters and
input layouts give the same text. ``def_kernel`` and ``gen_defines`` are placeholders
that ``render`` fills in, at their line's indentation, once every argument is known, so
hooks may be used in any order and at any indentation; so are ``modification`` (its
statements are translated at once, so a refusal raises while rendering),
``modification_inputs`` and ``def_prologue``. A subgraph that does not translate raises
``SubgraphError``; a prologue on an input that no ``def_prologue`` claims raises
``ValueError`` (the choice is not fused).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from torch._inductor import ir
from torch._inductor.codegen.common import Kernel
from torch._inductor.virtualized import V

from ..compile.compiler import entry_name
from ..compile.specs import ArgSpec, Workspace, specs_key
from ..exc import SubgraphError, format_params
from .defines import gen_defines
from .epilogue import IDENTITY, EpiloguePlan
from .prologue import ProloguePlan, identity_source
from .subgraph import Captures, translate_modification

DEF_KERNEL_PLACEHOLDER = "<DEF_KERNEL>"
DEF_PROLOGUE_PLACEHOLDER = "<DEF_PROLOGUE>"
GEN_DEFINES_PLACEHOLDER = "<GEN_DEFINES>"
MODIFICATION_INPUTS_PLACEHOLDER = "<MODIFICATION_INPUTS>"
KERNEL_NAME_PLACEHOLDER = "__CUTEDSL_KERNEL_NAME__"
WORKSPACE_PARAM = "workspace"

IMPORTS = """\
import math
import operator

import torch
import cutlass
import cutlass.cute as cute
import cuda.bindings.driver as cuda
from cutlass.cute.runtime import from_dlpack

"""


def name_kernel(template_name: str, rendered: str, specs: list[ArgSpec]) -> tuple[str, str]:
    """(kernel name, final source) for source rendered with the name placeholder, whose
    entry is compiled for argument ``specs``. The name hashes the rendered text and the
    specs -- everything the binary is specialized on -- so it is the same in every
    process, and two call sites share a kernel (one definition in the output code, keyed
    by its source) only where they share its binary."""
    material = f"{rendered}\0{specs_key(specs)}"
    digest = hashlib.sha256(material.encode()).hexdigest()[:12]
    name = f"cutedsl_{template_name}_{digest}"
    return name, rendered.replace(KERNEL_NAME_PLACEHOLDER, name)


def fill_placeholder(text: str, placeholder: str, block: str) -> str:
    """``text`` with ``placeholder`` replaced by ``block``, every line of the block after
    the first indented as the line the placeholder stands on: a hook rendered inside a
    function body stays inside it."""
    lines = text.split("\n")
    for index, line in enumerate(lines):
        if placeholder in line:
            indent = line[:len(line) - len(line.lstrip())]
            lines[index] = line.replace(placeholder, block.replace("\n", "\n" + indent))
    return "\n".join(lines)


def _unwrap(node: Any) -> Any:
    while isinstance(node, ir.MutableBox):
        node = node.data
    return node


def _is_buffer(node: Any, name: str) -> bool:
    """Whether ``node`` is buffer ``name`` itself (not a view of it)."""
    inner = _unwrap(node)
    return not isinstance(inner, ir.BaseView) and inner.get_name() == name


def call_reference(node: Any) -> str:
    """How the output code names ``node``: its buffer, or a reinterpret_tensor view."""
    inner = _unwrap(node)
    if isinstance(inner, ir.BaseView):
        return ir.ExternKernel.convert_to_reinterpret_view(inner).codegen_reference()
    return node.get_name()


class CuteDSLTemplateKernel(Kernel):
    def __init__(
        self,
        kernel_name: str,
        input_nodes: list[Any],
        output_node: Any,
        params: Mapping[str, Any] | None = None,
        epilogue: EpiloguePlan = IDENTITY,
        subgraphs: list[Any] | None = None,
        template_name: str = "",
        prologue: ProloguePlan | None = None,
        workspace: Workspace | None = None,
    ) -> None:
        super().__init__()
        self.kernel_name = kernel_name
        self.input_nodes = list(input_nodes)
        # a fused epilogue writes its own buffer instead of the template's output
        self.output_node = epilogue.output if epilogue.output is not None else output_node
        self.output_rank = len(output_node.get_size()) if output_node is not None else 0
        self.params = dict(params or {})
        self.epilogue = epilogue
        # a fused prologue: its source replaces the input it writes (``def_kernel``)
        self.prologue = prologue
        self.prologue_operand: str | None = None  # that input's name in ``def_kernel``
        self._prologue_claim: str | None = None  # the input ``def_prologue`` names
        # (parameter name in the entry signature, IR node), in call order
        self.template_inputs: list[tuple[str, Any]] = []
        self._renames: list[str] = []
        self._hooks: dict[str, Any] = {}
        # the subgraphs ``modification`` renders and the captured tensors they read
        self.subgraphs = list(subgraphs or [])
        self.template_name = template_name
        self.captures = Captures(self.input_nodes)
        self._modifications = 0
        self.workspace = workspace

    # -- hooks ---------------------------------------------------------------------

    def def_kernel(self, *arg_names: str) -> str:
        if DEF_KERNEL_PLACEHOLDER in self._hooks:
            raise ValueError("def_kernel() may be used once per template")
        if len(arg_names) > len(self.input_nodes):
            raise ValueError(
                f"def_kernel names {len(arg_names)} inputs but the choice has "
                f"{len(self.input_nodes)} input nodes"
            )
        for index, node in enumerate(self.input_nodes):
            name = arg_names[index] if index < len(arg_names) else f"input_{index}"
            if self.prologue is not None and _is_buffer(node, self.prologue.target):
                node = V.graph.get_buffer(self.prologue.source)
                self.prologue_operand = name
            self.template_inputs.append((f"arg_{name}", node))
            self._renames.append(f"{name} = arg_{name}")
        if self.output_node is not None:
            self.args.output(self.output_node.get_name())
        self._hooks[DEF_KERNEL_PLACEHOLDER] = self._render_signature
        return DEF_KERNEL_PLACEHOLDER

    def gen_defines(self) -> str:
        self._hooks[GEN_DEFINES_PLACEHOLDER] = lambda: gen_defines(self.params).rstrip("\n")
        return GEN_DEFINES_PLACEHOLDER

    def get_output(self) -> str:
        if self.output_node is None:
            raise ValueError("this template choice has no output node")
        name = self.output_node.get_name()
        if name not in self.args.output_buffers:
            raise ValueError("get_output() must come after def_kernel()")
        return self.args.output_buffers[name]

    def get_workspace(self) -> str:
        if self.workspace is None:
            raise ValueError("this template choice has no workspace")
        return WORKSPACE_PARAM

    def def_epilogue(self, tile_input: bool = False) -> str:
        """The ``<kernel_name>_epilogue(value, c0, .., extras)`` function (identity when
        nothing is fused); see ``template/epilogue.py``."""
        return self.epilogue.function_source(f"{self.kernel_name}_epilogue", self.output_rank,
                                             tile_input)

    def epilogue_tile_input(self) -> str:
        """The entry's name for the epilogue's tile input (``EpiloguePlan.tile_input``)."""
        if self.epilogue.tile_input is None:
            raise ValueError("this epilogue has no tile input")
        load = self.epilogue.register_loads[self.epilogue.tile_input]
        return self.args.input(self.epilogue.extra_buffers[load.extra])

    def epilogue_inputs(self) -> str:
        """The tuple of flat views of the epilogue's extra inputs, for the entry's body."""
        views = [
            f"cute.make_tensor({arg}.iterator, cute.make_layout(cute.cosize({arg}.layout)))"
            for arg in (self.args.input(name) for name in self.epilogue.extra_buffers)
        ]
        return f"({', '.join(views)}{',' if views else ''})"

    def def_prologue(self, operand: str) -> str:
        """The ``<kernel_name>_prologue(value, c0, .., extras)`` function: the fused
        prologue where it writes input ``operand``, else identity; see
        ``template/prologue.py``."""
        if self._prologue_claim is not None:
            raise ValueError("def_prologue() may be used once per template")
        self._prologue_claim = operand
        self._hooks[DEF_PROLOGUE_PLACEHOLDER] = self._render_prologue
        return DEF_PROLOGUE_PLACEHOLDER

    def _render_prologue(self) -> str:
        name = f"{self.kernel_name}_prologue"
        if self.prologue is None or self.prologue_operand != self._prologue_claim:
            return identity_source(name, self.output_rank).rstrip("\n")
        return self.prologue.function_source(name).rstrip("\n")

    def prologue_inputs(self) -> str:
        """The tuple of flat views of the prologue's extra inputs, for the entry's body."""
        names = self.prologue.extra_buffers if self.prologue is not None else []
        views = [
            f"cute.make_tensor({arg}.iterator, cute.make_layout(cute.cosize({arg}.layout)))"
            for arg in (self.args.input(name) for name in names)
        ]
        return f"({', '.join(views)}{',' if views else ''})"

    def modification(self, subgraph_number: int, output_name: str | None,
                     mask: str | None = None, input_dtypes: dict[str, Any] | None = None,
                     **index_vars: str) -> str:
        """Statements computing subgraph ``subgraph_number`` into ``output_name`` (see
        ``template/subgraph.py``), at the hook's indentation; ``index_vars`` give each
        placeholder's CuTe expression (``score="acc[i]"``, ``h="h_idx"``). With
        ``output_name`` None the subgraph is a list of scatter stores (atomic adds)."""
        number = self._modifications
        self._modifications += 1
        try:
            if not isinstance(subgraph_number, int) or not (
                    0 <= subgraph_number < len(self.subgraphs)):
                raise IndexError(f"the choice has {len(self.subgraphs)} subgraph(s)")
            translation = translate_modification(
                self.subgraphs[subgraph_number], output_name, index_vars, self.captures,
                prefix=f"mod{subgraph_number}_{number}_", mask=mask, input_dtypes=input_dtypes)
        except (NotImplementedError, IndexError, TypeError) as err:
            raise SubgraphError(template=self.template_name or self.kernel_name,
                                params=format_params(self.params), subgraph=subgraph_number,
                                cause=f"{type(err).__name__}: {err}") from err
        placeholder = f"<MODIFICATION_{number}>"
        block = "\n".join(translation.lines)
        self._hooks[placeholder] = lambda: block
        return placeholder

    def modification_inputs(self) -> str:
        """The ``captures`` tuple for the modifications' code: a flat view of each captured
        tensor, for the entry's body (filled in once every modification is rendered)."""
        self._hooks[MODIFICATION_INPUTS_PLACEHOLDER] = self._render_captures
        return MODIFICATION_INPUTS_PLACEHOLDER

    def _render_captures(self) -> str:
        if len(self.template_inputs) != len(self.input_nodes):
            raise ValueError("modification_inputs() needs def_kernel()")
        args = [self.template_inputs[i][0] for i in self.captures.input_indices()]
        views = [f"cute.make_tensor({a}.iterator, cute.make_layout(cute.cosize({a}.layout)))"
                 for a in args]
        return f"({', '.join(views)}{',' if views else ''})"

    def size(self, arg: str, dim: int) -> str:
        """A size as a Python expression; symbolic sizes become entry parameters."""
        return self.kexpr(self.rename_indexing(self._node_named(arg).get_size()[dim]))

    def stride(self, arg: str, dim: int) -> str:
        return self.kexpr(self.rename_indexing(self._node_named(arg).get_stride()[dim]))

    def kexpr(self, expr: Any) -> str:
        from torch._inductor.codegen.common import PythonPrinter

        return PythonPrinter().doprint(expr)

    # -- rendering -----------------------------------------------------------------

    def render(self, template: Any, **extra_env: Any) -> str:
        """Render ``template`` (a jinja2.Template) and fill every placeholder."""
        text = template.render(
            kernel_name=self.kernel_name,
            input_nodes=self.input_nodes,
            output_node=self.output_node,
            def_kernel=self.def_kernel,
            def_epilogue=self.def_epilogue,
            epilogue_inputs=self.epilogue_inputs,
            epilogue_tile_input=self.epilogue_tile_input,
            modification=self.modification,
            modification_inputs=self.modification_inputs,
            def_prologue=self.def_prologue,
            prologue_inputs=self.prologue_inputs,
            has_prologue=self.prologue is not None,
            tile_input_index=self.epilogue.tile_input,
            has_epilogue=self.epilogue.output is not None,
            output_rank=self.output_rank,
            gen_defines=self.gen_defines,
            get_output=self.get_output,
            get_workspace=self.get_workspace,
            size=self.size,
            stride=self.stride,
            **self.params,
            **extra_env,
        )
        for placeholder, hook in self._hooks.items():
            text = fill_placeholder(text, placeholder, hook())
        if self.prologue is not None and (self.prologue_operand is None
                                          or self.prologue_operand != self._prologue_claim):
            raise ValueError(f"the template transforms no input {self.prologue_operand!r} "
                             f"(its def_prologue names {self._prologue_claim!r})")
        # no trailing blanks: the output code re-indents, which would alter such lines
        return "".join(line.rstrip() + "\n" for line in (IMPORTS + text).splitlines())

    def entry_params(self) -> list[str]:
        """The entry's parameters: template inputs, extras, output, workspace, sizes."""
        params = [name for name, _ in self.template_inputs]
        params += list(self.args.input_buffers.values())
        params += list(self.args.output_buffers.values())
        params += [WORKSPACE_PARAM] if self.workspace is not None else []
        params += list(self.args.sizevars.values())
        return params

    def _render_signature(self) -> str:
        params = ", ".join([*self.entry_params(), "stream"])
        lines = [f"def {entry_name(self.kernel_name)}({params}):"]
        lines += [f"    {rename}" for rename in self._renames]
        return "\n".join(lines)

    def _node_named(self, arg: str) -> Any:
        for param, node in self.template_inputs:
            if param == f"arg_{arg}":
                return node
        if self.output_node is not None and arg in ("out", self.get_output()):
            return self.output_node
        raise KeyError(f"no template argument named {arg!r}")

    # -- the call in the output code -----------------------------------------------

    def arg_nodes(self) -> list[Any]:
        """IR node (or ``Workspace``, or size expression) per entry argument, in signature
        order."""
        nodes: list[Any] = [node for _, node in self.template_inputs]
        nodes += [V.graph.get_buffer(buf) for buf in self.args.input_buffers]
        nodes += [
            self.output_node if buf == self.output_node.get_name() else V.graph.get_buffer(buf)
            for buf in self.args.output_buffers
        ]
        nodes += [self.workspace] if self.workspace is not None else []
        nodes += list(self.args.sizevars)
        return nodes

    def call_references(self, workspace: str | None = None) -> list[str]:
        """How the output code passes each entry argument (codegen time only); the
        workspace by the name the output code allocated it under."""
        refs = [call_reference(node) for _, node in self.template_inputs]
        refs += list(self.args.input_buffers) + list(self.args.output_buffers)
        refs += [workspace] if self.workspace is not None else []
        refs += [self.kexpr(expr) for expr in self.args.sizevars]
        return refs
