"""IR builders for CPU tests: real Inductor nodes on a (virtual) CUDA device; and what
/proc says of processes (the compile workers' tests)."""

import contextlib
import os
import time

import torch

from cutedsl_inductor.bench.lowering import (  # noqa: F401 (the tests' helpers too)
    kernel_definitions,
    load_kernels,
    lowered,
    virtual_sm90_patches,
)

# this torch's (major, minor), for behaviour that differs between releases
TORCH = tuple(int(part) for part in torch.__version__.split(".")[:2])


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


def use_virtual_sm90(monkeypatch):
    """Let Inductor treat "cuda" as an sm_90 GPU for the rest of the test
    (``cutedsl_inductor.bench.lowering``)."""
    for target, name, replacement in virtual_sm90_patches():
        monkeypatch.setattr(target, name, replacement)


@contextlib.contextmanager
def virtual_sm90_max_autotune(monkeypatch, backends, gemm_max_configs):
    """Max-autotune with ``backends`` and our epilogue fusion on a virtual sm_90 (see
    ``use_virtual_sm90``), the heuristic offering ``gemm_max_configs`` GEMM configs."""
    from cutedsl_inductor import config

    use_virtual_sm90(monkeypatch)
    with torch._inductor.config.patch(max_autotune=True, max_autotune_gemm_backends=backends), \
            config.patch(epilogue_fusion=True, gemm_max_configs=gemm_max_configs):
        yield


def compile_residual_gemm(cfg, dump_dir=None):
    """``Sm90Gemm`` plus a tile input: C = A @ B^T + R, R (bf16, laid out like C) loaded by
    TMA into the store buffers (``launch(mTile=...)``); compiled GPU-less for sm_90a,
    called as ``f(A, B, C, R)`` (bf16, the kernel's (M, K, L) / (N, K, L) / (M, N, L))."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor
    from cutlass.runtime import make_fake_stream

    from cutedsl_inductor.kernels.gemm.sm90_gemm import Sm90Gemm
    from cutedsl_inductor.kernels.gemm.standalone import make_fake_gemm_args

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


def cuobjdump():
    """NVIDIA's cuobjdump: on PATH, or from the ``nvidia-cuda-cuobjdump`` wheel (test
    extras); None where neither is."""
    return _nvidia_tool("cuobjdump")


def nvdisasm():
    """NVIDIA's nvdisasm (a cubin's SASS): on PATH, or from the ``nvidia-cuda-nvdisasm``
    wheel (test extras); None where neither is."""
    return _nvidia_tool("nvdisasm")


def _nvidia_tool(name):
    import shutil
    from pathlib import Path

    found = shutil.which(name)
    if found is None:
        try:
            import nvidia
        except ImportError:
            return None
        found = next((str(p) for root in nvidia.__path__
                      for p in Path(root).glob(f"cu*/bin/{name}")), None)
    return found


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


def process_state(pid):
    """A process's state letter ("R", "S", "T" stopped, "Z" zombie, ...), None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


def children(pid):
    """The pids of a process's children."""
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(name))
        except (FileNotFoundError, ProcessLookupError):
            continue
    return found


def zombie_children():
    """This process's children that exited and were not reaped."""
    return [pid for pid in children(os.getpid()) if process_state(pid) == "Z"]


def wait_until(condition, seconds, what):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)
