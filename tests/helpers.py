"""IR builders for CPU tests: real Inductor nodes on a (virtual) CUDA device."""

import ast
import contextlib
from types import SimpleNamespace

import torch


def make_input(graph, name, shape, dtype=torch.float32, stride=None, offset=0):
    from torch._inductor import ir

    layout = ir.FixedLayout(torch.device("cuda", 0), dtype, list(shape),
                            stride=list(stride) if stride else None, offset=offset)
    node = ir.TensorBox.create(ir.InputBuffer(name=name, layout=layout))
    graph.graph_inputs[name] = node
    return node


def make_layout(shape, dtype=torch.float32):
    from torch._inductor import ir

    return ir.FixedLayout(torch.device("cuda", 0), dtype, list(shape))


H200_PROPERTIES = SimpleNamespace(
    name="NVIDIA H200 (virtual)", major=9, minor=0, multi_processor_count=132, warp_size=32,
    regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048,
    max_threads_per_block=1024, total_memory=141 << 30, gcnArchName="",
)


def use_virtual_sm90(monkeypatch):
    """Let Inductor's lowerings and scheduler treat "cuda" as an sm_90 GPU on a machine
    without one: device queries answer for an H200 and Triton counts as installed. Nothing
    is benchmarked or launched; only lowering, fusion and our rendering run."""
    from torch._dynamo import device_interface
    from torch._inductor import scheduler

    def properties(device=None):
        return H200_PROPERTIES

    cuda = device_interface.CudaInterface
    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(cuda, "get_device_properties", staticmethod(properties))
    monkeypatch.setattr(cuda.Worker, "get_device_properties", staticmethod(properties))
    monkeypatch.setattr(cuda, "get_compute_capability", staticmethod(lambda device=None: 90))
    monkeypatch.setattr(scheduler, "has_triton", lambda: True)


@contextlib.contextmanager
def virtual_sm90_max_autotune(monkeypatch, backends, gemm_max_configs):
    """Max-autotune with ``backends`` and our epilogue fusion on a virtual sm_90 (see
    ``use_virtual_sm90``), the heuristic offering ``gemm_max_configs`` GEMM configs."""
    from cutedsl_inductor import config

    use_virtual_sm90(monkeypatch)
    with torch._inductor.config.patch(max_autotune=True, max_autotune_gemm_backends=backends), \
            config.patch(epilogue_fusion=True, gemm_max_configs=gemm_max_configs):
        yield


@contextlib.contextmanager
def lowered(fn, *shapes, dtype=torch.bfloat16, cpp_wrapper=False, post_grad=False):
    """Trace ``fn`` on fake CUDA tensors of ``shapes`` and lower it with Inductor (its
    C++ wrapper with ``cpp_wrapper``, after its post-grad passes with ``post_grad``);
    yields the GraphLowering, installed as V.graph (build a Scheduler from its
    operations)."""
    from torch._inductor.debug import DebugContext
    from torch._inductor.decomposition import select_decomp_table
    from torch._inductor.graph import GraphLowering
    from torch._inductor.virtualized import V
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    mode = FakeTensorMode()
    with mode:
        args = [torch.empty(shape, device="cuda", dtype=dtype) for shape in shapes]
    gm = make_fx(fn, decomposition_table=select_decomp_table(), tracing_mode="fake")(*args)
    if post_grad:
        from torch._inductor.fx_passes.post_grad import post_grad_passes

        with V.set_fake_mode(mode):
            post_grad_passes(gm, is_inference=True)
    graph = GraphLowering(gm, example_inputs=args, cpp_wrapper=cpp_wrapper)
    with V.set_graph_handler(graph), V.set_debug_handler(DebugContext()), \
            V.set_fake_mode(mode):
        graph.run(*args)
        yield graph


def kernel_definitions(code):
    """The ``name = load_kernel(...)`` statements of an output module."""
    return [node for node in ast.parse(code).body
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
            and getattr(node.value.func, "id", "") == "load_kernel"]


def load_kernels(definitions):
    """Run those statements, as the output module would (each kernel compiled, or found
    in the kernel cache); returns their namespace (kernel name -> wrapper)."""
    from cutedsl_inductor.compile.specs import ScalarSpec, Sym, TensorSpec
    from cutedsl_inductor.runtime.loader import load_kernel

    namespace = {"load_kernel": load_kernel, "TensorSpec": TensorSpec, "Sym": Sym,
                 "ScalarSpec": ScalarSpec}
    exec(compile(ast.Module(definitions, type_ignores=[]), "output_code", "exec"), namespace)
    return namespace


def compile_residual_gemm(cfg, dump_dir=None):
    """``Sm90Gemm`` plus a tile input: C = A @ B^T + R, R (bf16, laid out like C) loaded by
    TMA into the store buffers (``launch(mTile=...)``); compiled GPU-less for sm_90a,
    called as ``f(A, B, C, R)`` (bf16, the kernel's (M, K, L) / (N, K, L) / (M, N, L))."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor
    from cutlass.runtime import make_fake_stream

    from cutedsl_inductor.templates.gemm.sm90_gemm import Sm90Gemm
    from cutedsl_inductor.templates.gemm.standalone import make_fake_gemm_args

    class ResidualGemm(Sm90Gemm):
        @cute.jit
        def __call__(self, mA, mB, mC, mR, stream):
            self.launch(mA, mB, mC, None, 1, 0, stream, mTile=mR)

        @cute.jit
        def epilogue_tile_input(self, prefetched, values):
            residual = cute.make_rmem_tensor((cute.size(values),), cutlass.Float32)
            for i in cutlass.range(cute.size(values), unroll_full=True):
                residual[i] = values[i].to(cutlass.Float32)
            return residual

        @cute.jit
        def epilogue_op(self, acc, coords, l_idx, prob_m, prob_n, mBias, alpha, beta,
                        epi_args, prefetched):
            for i in cutlass.range(cute.size(acc), unroll_full=True):
                acc[i] = acc[i] + prefetched[i]

    a, b, c, _ = make_fake_gemm_args("bf16", "bf16", "k", "k")
    residual = make_fake_tensor(cutlass.BFloat16, c.shape, c.stride, assumed_align=16)
    return cute.compile(ResidualGemm(**cfg), a, b, c, residual,
                        make_fake_stream(use_tvm_ffi_env_stream=True),
                        options="--enable-tvm-ffi"
                        + (f" --keep-ptx --dump-dir {dump_dir}" if dump_dir else ""))


def run_unprivileged(args, **kwargs):
    """``subprocess.run(args)`` without root's power over files: as root, in a user
    namespace where this user is uid 1000 without capabilities (root's files look like
    its own, other users' like nobody's), so that file modes bind it; as any other user,
    plainly. Skips the test where user namespaces are not allowed."""
    import os
    import shutil
    import subprocess

    import pytest

    prefix = []
    if os.geteuid() == 0:
        if shutil.which("unshare") is None:
            pytest.skip("no unshare command here")
        prefix = ["unshare", "--user", "--map-user=1000", "--map-group=1000"]
        probe = subprocess.run([*prefix, "true"], capture_output=True)
        if probe.returncode != 0:
            pytest.skip(f"no user namespaces here: {probe.stderr.decode().strip()}")
    return subprocess.run([*prefix, *args], **kwargs)
