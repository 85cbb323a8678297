"""Our kernels under Inductor's C++ wrapper (``config.aot``), GPU-less: real graphs lowered
on the virtual sm_90 with cpp_wrapper and with AOTInductor, their C++ checked by the C++
compiler against torch's and CUDA's headers, and the launch helper driven through a real
exported kernel up to its own argument checks (no GPU: they refuse a CPU tensor)."""

import os
import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest
import torch
from torch._inductor.lowering import lowerings, register_lowering

from cutedsl_inductor import config
from cutedsl_inductor.autotune.select import autotune_select_algorithm
from cutedsl_inductor.compile.exported import SHIPPED_SUFFIX
from cutedsl_inductor.inductor.cpp_runtime import CPP_RUNTIME
from cutedsl_inductor.kernels.elementwise import add_template
from tests.helpers import TORCH, lowered, use_virtual_sm90

TORCH_INCLUDE = Path(torch.__file__).parent / "include"
TORCH_LIB = Path(torch.__file__).parent / "lib"
CUDA_INCLUDE = next((p for p in (os.environ.get("CUDA_HOME", ""), "/usr/local/cuda")
                     if p and (Path(p) / "include" / "cuda.h").is_file()), None)
needs_cuda_headers = pytest.mark.skipif(CUDA_INCLUDE is None or shutil.which("g++") is None,
                                        reason="needs g++ and CUDA's headers")


def _register_single_add():
    """``cutedsl_test::aot_add``: lowered to one choice of the add template (no ATen)."""
    if not hasattr(torch.ops.cutedsl_test, "aot_add"):
        @torch.library.custom_op("cutedsl_test::aot_add", mutates_args=())
        def aot_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return a + b

        aot_add.register_fake(lambda a, b: torch.empty_like(a))
    op = torch.ops.cutedsl_test.aot_add.default
    if op not in lowerings:
        @register_lowering(op)
        def lower(a, b):
            choices = []
            add_template.maybe_append_choice(choices, input_nodes=[a, b],
                                             layout=a.get_layout(), THREADS=128, VECTOR=4)
            return autotune_select_algorithm("aot_add", choices, [a, b], a.get_layout())


@pytest.fixture
def cpp_lowering(monkeypatch, tmp_path):
    """The virtual sm_90 with ``config.aot``; staged files under this test's folder."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    use_virtual_sm90(monkeypatch)
    _register_single_add()
    with config.patch(aot=True):
        yield


def add_relu(a, b):
    return torch.relu(torch.ops.cutedsl_test.aot_add(a, b))


def generated(fn, *shapes, aot_mode, dtype=torch.float32, jit_entry=False):
    """(C++ source, the wrapper's additional files) of ``fn`` lowered with the C++ wrapper.
    Under AOTInductor, AOTI's source; with ``jit_entry``, that of the JIT entry torch
    2.14 writes beside it (dual wrapper mode)."""
    with torch._inductor.config.patch(cpp_wrapper=True), \
            lowered(fn, *shapes, dtype=dtype, cpp_wrapper=True, aot_mode=aot_mode) as graph:
        code = graph.codegen()[0].value  # the JIT entry's, in dual wrapper mode
        files = list(graph.wrapper_code.additional_files)
        aot = getattr(graph.wrapper_code, "_aot_output", None)  # AOTI's, in that mode
        if aot is not None and not jit_entry:
            code = aot
    if not aot_mode:
        code = code.split('cpp_wrapper_src = (\nr"""', 1)[1].split('"""\n)', 1)[0]
    # lowered outside compile_fx, the code ends with the Python wrapper's runner lines
    code = "\n".join(line for line in code.splitlines()
                     if not re.match(r"(runner|call|recursively_apply_fns) = ", line))
    return code, files


def launches(code):
    return [line.strip() for line in code.splitlines()
            if line.strip().startswith("cutedsl_aot::launch(")]


def kernel_files(code):
    """{C++ name: library file} of the kernel definitions."""
    return dict(re.findall(r'static cutedsl_aot::Kernel (\w+)\{"([^"]+)", "__tvm_ffi_\w+"\};',
                           code))


def compiles(code, tmp_path):
    """g++ accepts ``code`` (a wrapper's whole translation unit) as C++20."""
    source = tmp_path / "wrapper.cpp"
    source.write_text(code)
    run = subprocess.run(
        ["g++", "-std=c++20", "-fsyntax-only", "-DUSE_CUDA", f"-I{TORCH_INCLUDE}",
         f"-I{CUDA_INCLUDE}/include", f"-I{sysconfig.get_paths()['include']}", str(source)],
        capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]


def test_cpp_wrapper_launches_the_fused_add_through_the_exported_library(cpp_lowering):
    code, _ = generated(add_relu, (64, 128), (64, 128), aot_mode=False)
    (launch,) = launches(code)
    ((name, path),) = kernel_files(code).items()
    assert launch == (f"cutedsl_aot::launch({name}, cutedsl_runtime, std::nullopt, stream0, "
                      "{cutedsl_aot::tensor(a_1, 2, 32), cutedsl_aot::tensor(b_1, 2, 32), "
                      "cutedsl_aot::tensor(buf1, 2, 32)});")  # relu fused: one kernel
    assert Path(path).is_file() and path.endswith(SHIPPED_SUFFIX)
    assert code.count("namespace cutedsl_aot {") == 1


def test_without_the_knob_our_choice_is_refused_saying_why(cpp_lowering, caplog):
    with config.patch(aot=False), pytest.raises(Exception, match="NoValidChoices"):
        generated(add_relu, (64, 128), (64, 128), aot_mode=False)
    assert "launches CuteDSL kernels only with" in caplog.text
    assert "CUTEDSL_INDUCTOR_AOT=1" in caplog.text


@needs_cuda_headers
def test_aotinductor_ships_kernel_and_runtime_and_its_cpp_compiles(cpp_lowering, tmp_path):
    code, files = generated(add_relu, (64, 128), (64, 128), aot_mode=True)
    (launch,) = launches(code)
    assert ", cutedsl_runtime, this->cubin_dir_, stream, {" in launch
    (path,) = kernel_files(code).values()
    names = sorted(Path(f).name for f in files)
    assert names == sorted([Path(path).name, f"libcute_dsl_runtime.so{SHIPPED_SUFFIX}",
                            f"libtvm_ffi.so{SHIPPED_SUFFIX}"])
    # AOTInductor's package loader takes any .so or .o in the model folder for its own
    assert not any(name.endswith((".so", ".o")) for name in names)
    compiles(code, tmp_path)


@needs_cuda_headers
def test_the_gemm_takes_its_transposed_weight_as_a_view(cpp_lowering, tmp_path):
    with config.patch(gemm_max_configs=1), torch._inductor.config.patch(
            max_autotune=True, max_autotune_gemm_backends="CUTEDSL"):
        code, _ = generated(lambda x, w: x @ w.t(), (256, 128), (512, 128), aot_mode=True,
                            dtype=torch.bfloat16)
    (launch,) = launches(code)
    assert re.search(r"cutedsl_sm90_gemm_\w+_cpp, cutedsl_runtime", launch)
    assert "cutedsl_aot::tensor(wrap_with_raii_handle_if_needed(reinterpret_tensor_wrapper(" \
        "w_1, 2, " in launch and ", 4, 16)" in launch  # bf16: DLPack's code 4
    compiles(code, tmp_path)


@needs_cuda_headers
@pytest.mark.skipif(TORCH < (2, 14), reason="torch 2.14's AOTInductor writes a JIT entry too")
def test_aotinductors_jit_entry_launches_on_its_own_stream_and_compiles(cpp_lowering, tmp_path):
    code, _ = generated(add_relu, (64, 128), (64, 128), aot_mode=True, jit_entry=True)
    assert "void inductor_entry_impl(" in code and "this->" not in code
    (launch,) = launches(code)
    assert ", cutedsl_runtime, std::nullopt, stream0, {" in launch
    compiles(code, tmp_path)


DRIVER = """
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <cstdio>
{runtime}
{tables}
int main() {{
  int64_t sizes[] = {sizes}, strides[] = {strides};
  AtenTensorHandle t[3];
  for (auto& handle : t) {{
    aoti_torch_empty_strided({rank}, sizes, strides, aoti_torch_dtype_float32(),
                             aoti_torch_device_type_cpu(), 0, &handle);
  }}
  try {{
    cutedsl_aot::launch({kernel}, cutedsl_runtime, std::nullopt, nullptr,
        {{cutedsl_aot::tensor(t[0], 2, 32), cutedsl_aot::tensor(t[1], 2, 32),
          cutedsl_aot::tensor(t[2], 2, 32)}});
    std::printf("launched\\n");
  }} catch (const std::exception& e) {{
    std::printf("%s\\n", e.what());
  }}
}}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
@pytest.mark.parametrize("rank", [2, 3])
def test_the_launch_reaches_the_kernels_own_argument_checks(cpp_lowering, tmp_path, rank):
    """Loaded as the wrapper loads it (runtime libraries by SONAME or file, the kernel
    library, TVM-FFI's functions through it), called with DLTensors of the tensors' own
    rank and device: the kernel decodes them and refuses, by its TVM-FFI error."""
    code, _ = generated(add_relu, (64, 128), (64, 128), aot_mode=False)
    tables = "\n".join(line for line in code.splitlines()
                       if line.startswith(("static const cutedsl_aot::Library",
                                           "static cutedsl_aot::Kernel")))
    (kernel,) = kernel_files(code)
    shape = {2: ("{64, 128}", "{128, 1}"), 3: ("{64, 128, 1}", "{128, 1, 1}")}[rank]
    (tmp_path / "driver.cpp").write_text(DRIVER.format(
        runtime=CPP_RUNTIME, tables=tables, kernel=kernel, sizes=shape[0], strides=shape[1],
        rank=rank))
    subprocess.run(["g++", "-std=c++17", f"-I{TORCH_INCLUDE}", str(tmp_path / "driver.cpp"),
                    "-o", str(tmp_path / "driver"), f"-L{TORCH_LIB}", "-ltorch_cpu", "-lc10",
                    f"-Wl,-rpath,{TORCH_LIB}", "-ldl"], check=True, timeout=600)
    run = subprocess.run([str(tmp_path / "driver")], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "ValueError: Mismatched Tensor on argument #0" in run.stdout
    assert ("expected ndim=2" if rank == 3 else "expected device_type=cuda") in run.stdout
