"""Our kernels under Inductor's C++ wrapper (``config.aot``), GPU-less: real graphs lowered
on the virtual sm_90 with cpp_wrapper and with AOTInductor (the add, the GEMM, alone and
between two Triton kernels, a workspace, FlexAttention's forward with its BlockMask
tables, captured tensors and LSE), their C++ checked by the C++ compiler against torch's
and CUDA's headers, and the launch helper driven through a real exported kernel up to its
own argument checks (no GPU: they refuse a CPU tensor); choices that do not export refused
at autotuning, saying why."""

import logging
import os
import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest
import torch
import torch.utils._triton
from torch._inductor.lowering import lowerings, register_lowering

from cutedsl_inductor import config
from cutedsl_inductor.autotune.select import autotune_select_algorithm
from cutedsl_inductor.compile.exported import SHIPPED_SUFFIX
from cutedsl_inductor.exc import NotExportableError
from cutedsl_inductor.inductor import flex
from cutedsl_inductor.inductor.cpp_runtime import CPP_RUNTIME
from cutedsl_inductor.kernels.elementwise import add_template
from tests.helpers import TORCH, lowered, use_virtual_sm90
from tests.inductor.flex_graphs import B, D, FLEX_MODULE, H, OURS, S, lower, use_virtual_flex
from tests.inductor.test_scheduling import register_plus_scratch

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
    return cpp_source(code, aot_mode), files


def cpp_source(code, aot_mode):
    """The C++ translation unit of a C++ wrapper's output code."""
    if not aot_mode:
        code = code.split('cpp_wrapper_src = (\nr"""', 1)[1].split('"""\n)', 1)[0]
    # lowered outside compile_fx, the code ends with the Python wrapper's runner lines
    return "\n".join(line for line in code.splitlines()
                      if not re.match(r"(runner|call|recursively_apply_fns) = ", line))


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


def rmsnorm_gemm_relu_sum(x, w):
    normed = x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype)
    return torch.relu(normed @ w.t()).sum(-1)


@needs_cuda_headers
def test_a_triton_kernel_before_ours_finds_the_stream_declared(cpp_lowering, monkeypatch,
                                                               tmp_path):
    """Triton kernels before and after our GEMM (an rmsnorm, a relu and sum) under
    cpp_wrapper: the stream is declared before its first use, whichever kernel uses it
    first (issue #66: a Llama's first Triton call named ``stream0`` before our launch
    declared it). The Triton calls are compiled lazily, at run time, so no Triton here."""
    monkeypatch.setattr(torch.utils._triton, "triton_hash_with_backend", lambda: "none")
    with config.patch(gemm_max_configs=1), torch._inductor.config.patch(
            {"max_autotune": True, "max_autotune_gemm_backends": "CUTEDSL",
             "triton.autotune_at_compile_time": False}):
        code, _ = generated(rmsnorm_gemm_relu_sum, (256, 128), (512, 128), aot_mode=False,
                            dtype=torch.bfloat16)
    lines = [line.strip() for line in code.splitlines()]
    calls = {i: "ours" if line.startswith("cutedsl_aot::launch(") else "triton"
             for i, line in enumerate(lines)
             if line.startswith(("call_triton_", "cutedsl_aot::launch("))}
    assert list(calls.values()) == ["triton", "ours", "triton"]
    assert lines.index("cudaStream_t stream0;") < min(calls)
    compiles(code, tmp_path)


DRIVER = """
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <cstdio>
{runtime}
{tables}
AtenTensorHandle cpu_tensor(int64_t rank, const int64_t* sizes, const int64_t* strides,
                            int32_t dtype) {{
  AtenTensorHandle handle;
  aoti_torch_empty_strided(rank, sizes, strides, dtype, aoti_torch_device_type_cpu(), 0, &handle);
  return handle;
}}
int main() {{
{tensors}
  try {{
    cutedsl_aot::launch({kernel}, cutedsl_runtime, std::nullopt, nullptr, {{{args}}});
    std::printf("launched\\n");
  }} catch (const std::exception& e) {{
    std::printf("%s\\n", e.what());
  }}
}}
"""
DLPACK = {"float32": (2, 32), "bfloat16": (4, 16), "int32": (0, 32)}


def driven(code, tensors, tmp_path, env=None):
    """What the launch of the wrapper's one kernel says, made from a C++ program (torch's
    C shim, no Python) with CPU tensors of ``tensors`` ((sizes, dtype) each, contiguous),
    loaded as the wrapper loads it: runtime libraries by SONAME or file, the kernel
    library, TVM-FFI's functions through it."""
    tables = "\n".join(line for line in code.splitlines()
                       if line.startswith(("static const cutedsl_aot::Library",
                                           "static cutedsl_aot::Kernel")))
    (kernel,) = kernel_files(code)
    lines, args = [], []
    for i, (sizes, dtype) in enumerate(tensors):
        strides = [1] * len(sizes)
        for d in range(len(sizes) - 2, -1, -1):
            strides[d] = strides[d + 1] * sizes[d + 1]
        lines.append(f"  int64_t sizes{i}[] = {{{', '.join(map(str, sizes))}}}, "
                     f"strides{i}[] = {{{', '.join(map(str, strides))}}};")
        lines.append(f"  AtenTensorHandle t{i} = cpu_tensor({len(sizes)}, sizes{i}, strides{i}, "
                     f"aoti_torch_dtype_{dtype}());")
        args.append(f"cutedsl_aot::tensor(t{i}, {DLPACK[dtype][0]}, {DLPACK[dtype][1]})")
    (tmp_path / "driver.cpp").write_text(DRIVER.format(
        runtime=CPP_RUNTIME, tables=tables, tensors="\n".join(lines), kernel=kernel,
        args=", ".join(args)))
    subprocess.run(["g++", "-std=c++17", f"-I{TORCH_INCLUDE}", str(tmp_path / "driver.cpp"),
                    "-o", str(tmp_path / "driver"), f"-L{TORCH_LIB}", "-ltorch_cpu", "-lc10",
                    f"-Wl,-rpath,{TORCH_LIB}", "-ldl"], check=True, timeout=600)
    run = subprocess.run([str(tmp_path / "driver")], capture_output=True, text=True,
                         timeout=120, env=None if env is None else {**os.environ, **env})
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout + run.stderr


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
@pytest.mark.parametrize("rank", [2, 3])
def test_the_launch_reaches_the_kernels_own_argument_checks(cpp_lowering, tmp_path, rank):
    """Called with DLTensors of the tensors' own rank and device: the kernel decodes them
    and refuses, by its TVM-FFI error."""
    code, _ = generated(add_relu, (64, 128), (64, 128), aot_mode=False)
    shape = (64, 128) if rank == 2 else (64, 128, 1)
    said = driven(code, [(shape, "float32")] * 3, tmp_path)
    assert "ValueError: Mismatched Tensor on argument #0" in said
    assert ("expected ndim=2" if rank == 3 else "expected device_type=cuda") in said
    assert "[cutedsl_aot]" not in said


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_with_cutedsl_aot_trace_each_load_step_and_launch_says_so(cpp_lowering, tmp_path):
    """A deployed process that dies inside a step shows which (stderr, flushed)."""
    code, _ = generated(add_relu, (64, 128), (64, 128), aot_mode=False)
    said = driven(code, [((64, 128), "float32")] * 3, tmp_path, {"CUTEDSL_AOT_TRACE": "1"})
    steps = [line.split()[1] for line in said.splitlines() if line.startswith("[cutedsl_aot]")]
    # this C++ program has loaded neither runtime library: both come from their files
    assert steps == ["loading"] * 3 + ["calling", "returned"], said
    assert "libcute_dsl_runtime.so" in said and "__tvm_ffi_cutedsl_" in said


# FlexAttention's forward (``tests/inductor/flex_graphs.py``: B, H, S, D = 2, 4, 200, 64)

@pytest.fixture
def cpp_flex(cpp_lowering, monkeypatch):
    use_virtual_flex(monkeypatch)


def alibi_tempered(score, b, h, q_idx, kv_idx, slopes, temperature):
    return score * temperature + slopes[h] * (kv_idx - q_idx)


def lower_flex(aot_mode, **kwargs):
    code, files = lower({"CUTEDSL": True}, cpp_wrapper=True, aot_mode=aot_mode, **kwargs)
    return cpp_source(code, aot_mode), files


@needs_cuda_headers
def test_aotinductor_launches_flex_with_its_block_mask_captures_and_lse(cpp_flex, tmp_path):
    code, files = lower_flex(True, score_mod=alibi_tempered,
                             captured=[((H,), torch.float32), ((), torch.float32)])
    (launch,) = launches(code)
    ((name, path),) = kernel_files(code).items()
    assert name.startswith(f"{OURS}_")
    bf16, fp32, int32 = (4, 16), (2, 32), (0, 32)
    # q, k, v; lse and max (written); the BlockMask's four tables; the slopes and the
    # temperature (a 0-d tensor, a DLTensor like any other); out
    args = re.findall(r"cutedsl_aot::tensor\((\w+), (\d+), (\d+)\)", launch)
    assert [(int(c), int(b)) for _, c, b in args] == \
        [bf16] * 3 + [fp32] * 2 + [int32] * 4 + [fp32, fp32, bf16]
    # the graph's inputs: q, k, v, the BlockMask's eight tables (the forward reads the
    # KV four), the captures (in the HOP's order before torch 2.15, in the score_mod's
    # reads on 2.15: the temperature first)
    names = [a for a, _, _ in args]
    assert names[:3] + names[5:9] == [f"arg{i}_1" for i in range(7)]
    assert names[9:11] == (["arg12_1", "arg11_1"] if TORCH >= (2, 15) else ["arg11_1", "arg12_1"])
    lse, out = args[3][0], args[11][0]
    assert f"output_handles[0] = {out}.release();" in code
    assert f"output_handles[1] = {lse}.release();" in code  # the LSE is the graph's
    assert sorted(Path(f).name for f in files) == sorted(
        [Path(path).name, f"libcute_dsl_runtime.so{SHIPPED_SUFFIX}",
         f"libtvm_ffi.so{SHIPPED_SUFFIX}"])
    compiles(code, tmp_path)


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_cpp_wrapper_launches_flex_without_a_mask_and_the_kernel_checks_its_arguments(
        cpp_flex, tmp_path):
    """flex's "no mask" BlockMask: its unused full-block tables, one element each, are
    passed too; the kernel's library, loaded as the wrapper loads it, decodes the call."""
    code, _ = lower_flex(False, masked=False)
    (launch,) = launches(code)
    assert ", cutedsl_runtime, std::nullopt, stream" in launch
    assert len(re.findall(r"cutedsl_aot::tensor\(", launch)) == 10
    qkv = [((B, H, S, D), "bfloat16")] * 3
    said = driven(code, qkv + [((B, H, S), "float32")] * 2 + [((B, H, 1), "int32"),
                  ((B, H, 1, 1), "int32"), ((1,), "int32"), ((1,), "int32"),
                  ((B, H, S, D), "bfloat16")], tmp_path)
    assert "Mismatched Tensor on argument #0" in said and "expected device_type=cuda" in said


class Selected(Exception):
    pass


def flex_choices(monkeypatch, **kwargs):
    """The choices flex_attention's lowering autotunes over under the C++ wrapper."""
    seen = []

    def select(name, choices, *args, **kw):
        seen.extend(choices)
        raise Selected

    monkeypatch.setattr(FLEX_MODULE, "autotune_select_algorithm", select)
    with pytest.raises(Exception, match="Selected"):
        lower_flex(False, **kwargs)
    return seen


def test_a_flex_choice_that_does_not_export_is_refused_at_autotuning(
        cpp_flex, monkeypatch, caplog):
    (choice,) = flex_choices(monkeypatch)
    with config.patch(disk_cache=False), \
            caplog.at_level(logging.WARNING, logger="cutedsl_inductor"):
        choice.precompile()
    assert isinstance(choice.failure, NotExportableError)
    assert choice.benchmark(out=None) == float("inf")
    assert f"dropping CuteDSL choice {OURS}_" in caplog.text
    assert "the disk cache, which holds the exported libraries, is off" in caplog.text


def test_without_the_knob_flex_offers_nothing_and_says_why(cpp_flex, monkeypatch, caplog):
    with config.patch(aot=False), caplog.at_level(logging.WARNING, logger=flex.__name__):
        assert flex_choices(monkeypatch) == []
    assert "no CuteDSL flex_attention choice" in caplog.text
    assert "CUTEDSL_INDUCTOR_AOT=1" in caplog.text


@needs_cuda_headers
def test_a_workspace_is_allocated_zeroed_passed_and_freed_around_the_launch(
        cpp_lowering, tmp_path):
    """A choice's ``{{get_workspace()}}`` (the flex backward's fused dQ has one): the
    wrapper allocates it, zeroes it, passes it after the output and frees it."""
    register_plus_scratch()
    code, _ = generated(lambda a: torch.ops.cutedsl_test.plus_scratch(a), (1024,),
                        aot_mode=True)
    lines = [line.strip() for line in code.splitlines()]
    (launch,) = launches(code)
    call = lines.index(launch)
    assert launch.endswith("{cutedsl_aot::tensor(a_1, 2, 32), cutedsl_aot::tensor(buf0, 2, 32), "
                           "cutedsl_aot::tensor(workspace_0, 2, 32)});")
    zero = lines.index("AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_zero_(workspace_0.get()));")
    assert "RAIIAtenTensorHandle workspace_0(workspace_0_handle);" in lines[:zero]
    assert zero < call < lines.index("workspace_0.reset();")
    compiles(code, tmp_path)
