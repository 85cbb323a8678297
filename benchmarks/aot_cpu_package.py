"""A CUDA AOTInductor package with our GEMM, built and loaded on a machine without a GPU:
how far torch's package loader gets before it needs the device (docs/aot.md, "Package
load crash").

    CUDA_HOME=/usr/local/cuda python -m benchmarks.aot_cpu_package [--out DIR]

Needs a CUDA build of torch (e.g. 2.11.0+cu130: no GPU, no driver), CUDA's headers and a
C compiler. ``x @ w.T`` (bf16, 256x512x128) is lowered on the virtual sm_90
(``bench/lowering.py``) under max-autotune with our GEMM alone and ``config.aot``,
compiled by AOTInductor's ``AotCodeCompiler`` (linked against an empty ``libcuda.so``
stub: the driver is not installed) and packaged by ``package_aoti``; a fresh process where
CuTe DSL, TVM-FFI and this package do not import then constructs torch's
``AOTIModelPackageLoader`` on it. Prints the package's files and the loader's answer:
without a driver the model's constructor fails at its first CUDA call
(``cudaGetDevice``), after the archive's extraction, the choice of the model library
among the files and that library's ``dlopen`` and static initializers.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import torch

if not torch.cuda.is_available():  # CuTe DSL compiles for the virtual sm_90 (before cutlass)
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    os.environ.setdefault("CUTEDSL_INDUCTOR_ARCH", "sm_90a")

from cutedsl_inductor import config  # noqa: E402
from cutedsl_inductor.bench import aot_run  # noqa: E402
from cutedsl_inductor.bench.lowering import lowered, virtual_sm90  # noqa: E402

CONSTRUCT = (
    "import sys; sys.path.insert(0, sys.argv[1]); import aot_run; aot_run.block_imports(); "
    "import torch\n"
    "try:\n"
    "    torch._C._aoti.AOTIModelPackageLoader(sys.argv[2], 'model', False, 1, -1)\n"
    "    print('constructed')\n"
    "except Exception as err:\n"
    "    print('raised:', str(err).splitlines()[0][:300])\n")


def cuda_stub(folder: Path) -> Path:
    """An empty ``libcuda.so`` (SONAME ``libcuda.so.1``) for ``-lcuda`` to find."""
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(folder / "libcuda.so"),
                    "-Wl,-soname,libcuda.so.1", "-x", "c", "-"], input="int stub;\n",
                   text=True, check=True)
    return folder


def build(path: Path) -> list[str]:
    """The package's files (its model folder), written to ``path``."""
    from torch._inductor.codecache import AotCodeCompiler
    from torch._inductor.package import package_aoti

    options = {"cpp_wrapper": True, "aot_inductor.package": True, "max_autotune": True,
               "max_autotune_gemm_backends": "CUTEDSL",
               "triton.autotune_at_compile_time": False}
    with virtual_sm90(), config.patch(aot=True, gemm_max_configs=1), \
            torch._inductor.config.patch(options), \
            lowered(lambda x, w: x @ w.t(), (256, 128), (512, 128), aot_mode=True) as graph:
        wrapper, kernels = graph.codegen()
        # lowered outside compile_fx: the code ends with the Python wrapper's runner lines
        python_lines = ("runner = ", "call = ", "recursively_apply_fns = ")
        source = "\n".join(line for line in wrapper.value.splitlines()
                           if not line.startswith(python_lines))
        files = AotCodeCompiler.compile(graph, source, kernels.value, None, device_type="cuda",
                                        additional_files=list(graph.wrapper_code.additional_files))
    package_aoti(str(path), {"model": files})
    with zipfile.ZipFile(path) as archive:
        return [Path(name).name for name in archive.namelist() if "/aotinductor/" in name]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.aot_cpu_package")
    parser.add_argument("--out", type=Path, default=Path(tempfile.mkdtemp()))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    stub = cuda_stub(args.out)
    os.environ["LIBRARY_PATH"] = f"{stub}:{os.environ.get('LIBRARY_PATH', '')}"
    package = args.out / "ours.pt2"
    print(f"torch {torch.__version__}: {', '.join(build(package))}", flush=True)
    done = subprocess.run([sys.executable, "-X", "faulthandler", "-c", CONSTRUCT,
                           str(Path(aot_run.__file__).parent), str(package)],
                          capture_output=True, text=True, timeout=300)
    print(f"loader: rc {done.returncode} {done.stdout.strip()}", flush=True)
    for line in done.stderr.splitlines():
        if "error" in line.lower():  # the model's own message (its failed CUDA call)
            print(f"  {line.strip()}", flush=True)


if __name__ == "__main__":
    main()
