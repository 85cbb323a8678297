"""Upstream-style modules: ``from_dlpack`` records and ``JitOnce``.

An upstream-style module's plain Python entry converts each torch tensor with
``from_dlpack`` and calls a module-level ``@cute.jit`` function with the results and
``cuda.CUstream(stream)``; CuTe's JitExecutor then converts every argument again, on
every call. The loader (``runtime/loader.py``) rebinds, in the modules it runs, each
``@cute.jit`` function to a ``JitOnce`` and, with ``config.upstream_fast_path`` (on by
default), CuTe's ``from_dlpack`` to ``record_dlpack``:

* ``record_dlpack`` of a torch tensor (the type itself) with the options
  ``assumed_align`` and ``use_32bit_stride`` returns a ``TensorRecord``: a CuTe runtime
  tensor (a subclass of CuTe's own) that holds the torch tensor and its options, records
  ``mark_layout_dynamic`` and ``mark_compact_shape_dynamic`` and defers the conversion.
  The first use of anything else (an attribute, a method, setting one) converts it in
  place, as ``from_dlpack`` would have, replaying the marks: from then on it is that
  tensor. Any other input or option gets the real ``from_dlpack``. It checks nothing
  more, so that a launch pays little per tensor: what DLPack refuses is told by the key.
* ``JitOnce`` called with unconverted records, ``CUstream``s and Python scalars launches
  a TVM-FFI function with the torch tensors themselves. Its key is each record's torch
  metadata (dtype, shape, strides, device, layout, whether it requires grad, a complex
  tensor's conjugate bit, options, marks; with an ``assumed_align``, whether the pointer
  has it) and each other argument's type (a scalar's value too): finer than CuTe's key,
  which it determines. A new key converts the records once, with
  TVM-FFI, and looks up their CuTe key (each tensor's ``__cache_key__`` and device type,
  what the JitExecutor path keys on), compiling with ``--enable-tvm-ffi`` from the
  converted tensors where it has no function yet: a dynamic mark compiles once for all
  the shapes it covers. TVM-FFI checks dtype, static sizes and strides, alignment and
  device at each call. The stream stays an argument (TVM-FFI takes the ``CUstream``
  itself), so a launch uses the stream the entry gave.
* Any other call (a converted record, a CuTe tensor, another argument type) takes the
  JitExecutor path, as before: compiled once per CuTe ``__cache_key__`` of each argument
  (a stream is a runtime value; other Python values are part of the key).

Failure semantics: a compile error on the JitExecutor path is ``KernelCompileError``
naming the template, parameters and generated file. Where converting the records,
compiling them with TVM-FFI or TVM-FFI's argument checks at a call (before any launch)
fail, that key takes the JitExecutor path (a compile or call failure logged once), which
raises what it raised before (a mark CuTe refuses: its error, at the jit call). So does a
key whose tensor DLPack refuses to export: its conversion raises ``from_dlpack``'s error
at the jit call, not at the entry's line. (A view with the negative bit is exported as
its data by torch, CuTe and TVM-FFI alike, on either path.)
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable
from typing import Any

import cuda.bindings.driver as cuda
import cutlass.cute as cute
import torch
from cutlass.base_dsl.runtime.jit_arg_adapters import is_arg_annotation_constexpr
from cutlass.cute.runtime import _Tensor, from_dlpack

from .. import config, counters
from .compiler import COMPILE_LOCK, compile_error, compile_options, is_cute_jit, plain_ffi_function
from .records import KernelDescription

log = logging.getLogger(__name__)

_SCALARS = (int, float, bool, type(None))
_MISSING = object()
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def adopt(module: Any, arch: str, describe: KernelDescription) -> None:
    """Rebind ``module``'s ``@cute.jit`` functions to ``JitOnce`` and, with
    ``config.upstream_fast_path``, its names for CuTe's ``from_dlpack`` to
    ``record_dlpack`` (idempotent); without records every call takes the JitExecutor
    path."""
    for attr, value in list(vars(module).items()):
        if value is from_dlpack and config.upstream_fast_path:
            setattr(module, attr, record_dlpack)
        elif is_cute_jit(value):
            setattr(module, attr, JitOnce(value, arch, describe))


def record_dlpack(tensor: Any, assumed_align: Any = None, use_32bit_stride: Any = False,
                  **options: Any) -> Any:
    """``from_dlpack`` in the modules we load: a ``TensorRecord`` of a torch tensor with
    the options records stand for, else ``from_dlpack``'s result."""
    if (options or type(tensor) is not torch.Tensor or type(use_32bit_stride) is not bool
            or not (assumed_align is None or type(assumed_align) is int)):
        return from_dlpack(tensor, assumed_align, use_32bit_stride, **options)
    return TensorRecord(tensor, (assumed_align, use_32bit_stride))


def _recordable(tensor: torch.Tensor) -> bool:
    """Whether a TVM-FFI function can take ``tensor`` for ``from_dlpack(tensor)``: what
    DLPack refuses to export (gradients, conjugate views, sparse, quantized, other
    devices) takes the JitExecutor path, whose ``from_dlpack`` raises, as before. What it
    reads is in the fast path's key (quantized and complex dtypes in the dtype), so it
    runs once per key."""
    return ((tensor.is_cuda or tensor.is_cpu) and tensor.layout is torch.strided
            and not tensor.requires_grad and not tensor.is_quantized and not tensor.is_conj())


class TensorRecord(_Tensor):
    """``from_dlpack(tensor, assumed_align, use_32bit_stride)`` and its marks, not
    converted yet (the module docstring). Its own state is in ``_record_*`` attributes;
    CuTe's is set when it converts."""

    # CuTe tells its runtime objects by their class's module (``_is_cute_pointer_like``)
    __module__ = _Tensor.__module__
    _record_marks: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    _record_converted = False

    def __init__(self, tensor: torch.Tensor, options: tuple[int | None, bool]) -> None:
        state = vars(self)
        state["_record_tensor"] = tensor
        state["_record_options"] = options  # (assumed_align, use_32bit_stride)

    def __getattr__(self, name: str) -> Any:
        # an attribute of CuTe's tensor, not set before the conversion
        if name.startswith("_record_") or self._record_converted:
            raise AttributeError(name)
        return getattr(self.converted(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self.converted(), name, value)

    def mark_layout_dynamic(self, leading_dim: int | None = None) -> TensorRecord:
        return self._mark("mark_layout_dynamic", (leading_dim,))

    def mark_compact_shape_dynamic(self, mode: int, stride_order: Any = None,
                                   divisibility: int = 1) -> TensorRecord:
        return self._mark("mark_compact_shape_dynamic", (mode, stride_order, divisibility))

    def _mark(self, name: str, args: tuple[Any, ...]) -> TensorRecord:
        try:
            hash(args)  # the mark goes into the fast path's key
        except TypeError:
            self.converted()
        if self._record_converted:
            getattr(_Tensor, name)(self, *args)
        else:
            vars(self)["_record_marks"] = self._record_marks + ((name, args),)
        return self

    def cute_tensor(self, **options: Any) -> Any:
        """A new CuTe tensor: ``from_dlpack`` of the torch tensor with the recorded
        options and ``options``, the marks replayed."""
        tensor = from_dlpack(self._record_tensor, *self._record_options, **options)
        for name, args in self._record_marks:
            getattr(tensor, name)(*args)
        return tensor

    def converted(self) -> TensorRecord:
        """This record made the tensor ``from_dlpack`` gives, in place (once)."""
        if not self._record_converted:
            vars(self).update(vars(self.cute_tensor()), _record_converted=True)
        return self


def _fast_args(args: tuple[Any, ...]) -> tuple[tuple[Any, ...], list[Any]] | None:
    """(the TVM-FFI path's key of ``args``, what its function takes for them: the torch
    tensors for the records), or None where they take the JitExecutor path."""
    key, values = [], []
    for arg in args:
        kind = type(arg)
        if kind is TensorRecord:
            if arg._record_converted:
                return None
            tensor, options = arg._record_tensor, arg._record_options
            if options[0] and tensor.data_ptr() % options[0]:
                return None  # the JitExecutor path raises for it
            try:
                stride = tensor.stride()
            except RuntimeError:  # a layout without strides
                return None
            dtype = tensor.dtype
            key.append((dtype, tensor.shape, stride, tensor.device, tensor.layout,
                        tensor.requires_grad, dtype.is_complex and tensor.is_conj(), options,
                        arg._record_marks))
            values.append(tensor)
        elif kind is cuda.CUstream:
            key.append(kind)
            values.append(arg)
        elif kind in _SCALARS:
            key.append((kind, arg))
            values.append(arg)
        else:
            return None
    return tuple(key), values


def _jit_key(arg: Any) -> Any:
    """What the JitExecutor path keys an argument on."""
    cache_key = getattr(arg, "__cache_key__", None)
    if cache_key is not None:
        return cache_key
    if type(arg) is cuda.CUstream:
        return "stream"
    return (type(arg), arg)


def _runtime_positions(fn: Callable[..., Any]) -> tuple[int, tuple[int, ...]] | None:
    """(parameters, the positions TVM-FFI takes: not Constexpr, by CuTe's own test) of a
    ``@cute.jit`` function, or None where it has more than plain positional parameters
    or string annotations (which CuTe may resolve otherwise)."""
    params = list(inspect.signature(fn).parameters.values())
    if any(p.kind not in _POSITIONAL or isinstance(p.annotation, str) for p in params):
        return None
    return len(params), tuple(i for i, p in enumerate(params)
                              if not is_arg_annotation_constexpr(p.annotation, p.name, i, None))


def _count_compile(start: float) -> None:
    counters.kernels.add(compiled=1, compile_s=time.perf_counter() - start)


class JitOnce:
    """Stands in for a module-level ``@cute.jit`` function of an upstream-style module
    (the module docstring): each argument signature compiles once, per path."""

    def __init__(self, fn: Callable[..., Any], arch: str, describe: KernelDescription):
        self.fn = fn
        self.arch = arch
        self.describe = describe
        self.compiled: dict[tuple[Any, ...], Any] = {}  # CuTe key -> JitExecutor function
        self.fast: dict[tuple[Any, ...], Any] = {}  # torch key -> TVM-FFI function or None
        self._ffi: dict[tuple[Any, ...], Any] = {}  # CuTe key -> TVM-FFI function or None
        self._positions = _runtime_positions(fn)

    def __call__(self, *args: Any) -> Any:
        fast = self._fast(args)
        if fast is not None:
            key, values, function = fast
            counters.upstream.add(fast_calls=1)
            try:
                return function(*values)
            except (TypeError, ValueError) as err:  # TVM-FFI's argument checks: no launch
                self.fast[key] = None
                self._fall_back("does not take these arguments through TVM-FFI", err)
        return self._jit_call(args)

    def fast_function(self, args: tuple[Any, ...]) -> Any:
        """The TVM-FFI function that launches ``args`` (compiled for a new key), or None:
        they take the JitExecutor path."""
        fast = self._fast(args)
        return None if fast is None else fast[2]

    def _fast(self, args: tuple[Any, ...]) -> tuple[Any, list[Any], Any] | None:
        """(key, what the TVM-FFI function takes, that function) for ``args``, or None."""
        if self._positions is None or len(args) != self._positions[0]:
            return None
        found = _fast_args(args)
        if found is None:
            return None
        key, values = found
        function = self.fast.get(key, _MISSING)
        if function is _MISSING:
            with COMPILE_LOCK:
                if key not in self.fast:
                    self.fast[key] = self._ffi_function(args)
                function = self.fast[key]
        if function is None:
            return None
        arity, runtime = self._positions
        return key, (values if len(runtime) == arity else [values[i] for i in runtime]), function

    def _runtime(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """``args`` without the Constexpr ones, which compiled functions do not take."""
        if self._positions is None or len(args) != self._positions[0]:
            return args
        arity, runtime = self._positions
        return args if len(runtime) == arity else tuple(args[i] for i in runtime)

    def _ffi_function(self, args: tuple[Any, ...]) -> Any:
        """The TVM-FFI function of the CuTe key of ``args`` converted (compiled where it
        has none), or None where converting or compiling fails."""
        converted, cute_key = [], []
        if any(type(arg) is TensorRecord and not _recordable(arg._record_tensor) for arg in args):
            return None
        try:
            for arg in args:
                if type(arg) is TensorRecord:
                    device = arg._record_tensor.device.type
                    arg = arg.cute_tensor(enable_tvm_ffi=True)
                    cute_key.append((arg.__cache_key__, device))
                else:
                    cute_key.append(_jit_key(arg))
                converted.append(arg)
        except Exception:  # the JitExecutor path converts again and raises it
            counters.upstream.add(fallbacks=1)
            return None
        key = tuple(cute_key)
        if key not in self._ffi:
            self._ffi[key] = self._compile_ffi(converted)
        return self._ffi[key]

    def _compile_ffi(self, converted: list[Any]) -> Any:
        options = compile_options(self.arch, True)
        start = time.perf_counter()
        try:
            compiled = cute.compile(self.fn, *converted, options=options)
        except Exception as err:
            self._fall_back("does not compile with TVM-FFI for these arguments", err)
            return None
        _count_compile(start)
        counters.upstream.add(fast_compiled=1)
        return plain_ffi_function(compiled)

    def _fall_back(self, what: str, err: Exception) -> None:
        counters.upstream.add(fallbacks=1)
        log.warning("CuteDSL kernel %s: %s %s (%s: %s); they take CuTe's JitExecutor path",
                    self.describe.kernel, getattr(self.fn, "__name__", self.fn), what,
                    type(err).__name__, err)

    def _jit_call(self, args: tuple[Any, ...]) -> Any:
        args = tuple(arg.converted() if type(arg) is TensorRecord else arg for arg in args)
        key = tuple(_jit_key(arg) for arg in args)
        compiled = self.compiled.get(key)
        if compiled is None:
            compiled = self._compile(args, key)
        return compiled(*self._runtime(args))

    def _compile(self, args: tuple[Any, ...], key: tuple[Any, ...]) -> Any:
        with COMPILE_LOCK:
            if key in self.compiled:
                return self.compiled[key]
            options = compile_options(self.arch, False)
            start = time.perf_counter()
            try:
                compiled = cute.compile(self.fn, *args, options=options)
            except Exception as err:
                raise compile_error(self.describe, self.arch, err) from err
            _count_compile(start)
            self.compiled[key] = compiled
            return compiled
