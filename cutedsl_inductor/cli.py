"""Command line: ``cutedsl-inductor <command>`` (or ``python -m cutedsl_inductor``).

  demo                         the main job (see ``cutedsl_inductor.demo``)
  cache info [--verify] | cache clear
                               what the kernel cache holds (writing nothing; --verify:
                               each entry's files against its manifest), and the remote
                               tier / empty the local cache (kernels and tuning decisions)
  precompile [--arch sm_90a] [--templates elementwise,gemm] [--gemm-shapes S]
                               compile the built-in templates' default choices into the
                               cache, GPU or not; S: MxNxK,... or "suite" (bench gemm's
                               shapes), the GEMM choices for those shapes
  check FILE.py:TEMPLATE --shapes S [--param NAME=V1,V2] [--arch sm_90a]
                               compile a template's choices without a GPU and report
                               each kernel's registers, shared memory and spills
  bench gemm|epilogue|attention|model|aot|sweep|launch [...]
                               the benchmarks (``cutedsl_inductor/bench``; GPU)

One argparse parser with a sub-parser per command and per benchmark (each benchmark
module adds its own options, ``add_arguments``, and runs from them, ``main``), so that
every wrong argument ends in argparse's usage and one error line, exit status 2, before
anything runs.

Fast answers: this module imports nothing that imports torch, so that ``--help``,
``--version`` and ``cache info|clear`` answer in a fraction of a second from the
``cutedsl-inductor`` script (``cutedsl_inductor_cli``, which imports the package without
loading it). A command that compiles or runs loads the package (``_loaded``), and a
benchmark's module, with its options, is imported only where ``bench NAME`` names it.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.metadata
import re
import sys
from types import ModuleType
from typing import Any

from . import config, counters, load
from .bench.args import parse_shapes
from .catalog import BUILTIN_TEMPLATES
from .compile import versions
from .compile.cache import decisions, remote_cache
from .compile.cache.disk_cache import default_cache
from .exc import ConfigError
from .version import __version__

# name -> (module under ``bench``, summary): a benchmark's module is imported (with torch)
# only where its command runs or its own --help is asked for
BENCHES = {
    "gemm": ("gemm", "our GEMM against cuBLAS and Inductor's best Triton template"),
    "epilogue": ("epilogue", "GEMM blocks with fused epilogues against Inductor's default "
                             "and max-autotune"),
    "attention": ("attention", "FlexAttention forward and backward: ours against Inductor's "
                               "Triton flex and SDPA"),
    "model": ("model", "real models (transformers) under torch.compile, with and without "
                       "our kernels (needs a GPU and the [bench] extra)"),
    "aot": ("aot", "a transformers Llama packaged by AOTInductor with and without our "
                   "kernels, loaded and timed where CuTe DSL does not import (needs a GPU "
                   "and the [bench] extra)"),
    "sweep": ("sweep", "every GEMM config the heuristic ranks (and variants) against cuBLAS, "
                       "per shape"),
    "launch": ("launch", "launch overhead, cold and warm start of the add example"),
}


def _loaded(module: str) -> ModuleType:
    """``module`` (relative to the package), with the package loaded first (torch,
    Inductor: ``cutedsl_inductor.load``), for the commands that compile or run."""
    load()
    return importlib.import_module(module, __package__)


def _cache(args: argparse.Namespace) -> int:
    cache = default_cache(create=args.action == "clear")  # info writes nothing
    mode = cache.mode
    if args.action == "clear":
        if not mode.writable:
            print(f"not clearing {cache.root}: it {mode.note}", file=sys.stderr)
            return 1
        result = cache.clear()
        removed, errors = decisions.clear()
        print(f"removed {result.removed} entries and {removed} tuning decisions from "
              f"{cache.root}"
              + (f"; {result.busy} being written now were left" if result.busy else ""))
        for error in result.errors + errors:
            print(f"  could not remove {error}", file=sys.stderr)
        return 1 if result.errors or errors else 0
    entries = cache.entries(digests=args.verify)
    size = sum(entry["disk_bytes"] for entry in entries)
    print(f"cache dir: {cache.root}" + (f" ({mode.note})" if mode.note else "")
          + f"\nentries:   {len(entries)}\nsize:      {size / 1e6:.2f} MB")
    print("\n".join(cache_tiers()))
    for entry in entries:
        print(f"  {entry['key'][:16]}  {_entry_line(entry)}")
    damaged = sum(bool(entry.get("damaged")) for entry in entries)
    if args.verify:
        print(f"verified:  {len(entries) - damaged} of {len(entries)} entries' files match "
              f"their manifests" + (f"; {damaged} CORRUPT" if damaged else ""))
    return 1 if damaged else 0


def _entry_line(entry: dict) -> str:
    if entry.get("corrupt"):
        return "CORRUPT manifest"
    flag = "" if entry["verified"] else "  UNVERIFIED (rebuilt when next needed)"
    if entry.get("damaged"):
        flag = f"  CORRUPT: {entry['damaged']} (rebuilt when next needed)"
    return f"{entry.get('arch')}  {entry.get('template')}  {entry.get('params')}{flag}"


def cache_tiers() -> list[str]:
    """The tiers: tuning decisions stored locally, the remote tier (reachable or not) and
    this process's hits and misses in each (call it from a job to see its own)."""
    lines = [f"decisions: {len(decisions.entries())} (tuning decisions)"]
    tier = remote_cache.default_tier()
    if not config.remote_cache:
        lines.append("remote:    off (CUTEDSL_INDUCTOR_REMOTE_CACHE=1 turns it on)")
    elif tier is None:
        lines.append(f"remote:    {remote_cache.address()}: cannot be used (see the warning)")
    else:
        try:
            state = f"reachable ({tier.ping_ms():.1f} ms round trip)"
        except Exception as err:
            state = f"NOT reachable ({type(err).__name__}: {err})"
        sealed = "; entries sealed under the fleet secret" if tier.secret else ""
        lines.append(f"remote:    {tier.address}: {state}{sealed}")
    kernels, remote, tuned = counters.kernels, counters.remote, counters.decisions
    lines.append(
        f"this process: kernels {kernels.disk_hits} local hits, {kernels.remote_hits} "
        f"remote hits, {kernels.compiled} compiled; decisions {tuned.local_hits} local "
        f"hits, {tuned.remote_hits} remote hits, {tuned.misses} misses; remote "
        f"{remote.hits} hits, {remote.misses} misses, {remote.rejected} refused, "
        f"{remote.published} published, {remote.errors} errors")
    return lines


def _arch(text: str) -> str:
    """``--arch``: an arch CuTe DSL compiles for, checked before anything compiles."""
    from .compile.compiler import check_cute_arch  # imports torch: only where it is given

    try:
        return check_cute_arch(text, "--arch")
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _templates(text: str) -> tuple[str, ...]:
    """``--templates``: comma-separated names of built-in templates."""
    names = tuple(name.strip() for name in text.split(","))
    unknown = [name for name in names if name not in BUILTIN_TEMPLATES]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"{', '.join(map(repr, unknown))}: not a built-in template (one of "
            f"{', '.join(BUILTIN_TEMPLATES)})")
    return names


def _gemm_shapes(text: str) -> list[tuple[int, int, int]]:
    """``--gemm-shapes``: "suite" (``bench gemm``'s shapes) or ``MxNxK,...``."""
    if text != "suite":
        return parse_shapes(text)
    gemm = importlib.import_module(".bench.gemm", __package__)  # with torch: only for "suite"
    return gemm.SQUARES + gemm.LLM


def _tensor_shapes(text: str) -> list[tuple[int, ...]]:
    """``check --shapes``: each input's shape, ``1024x1000,1024x1000``."""
    shapes = []
    for item in text.split(","):
        dims = item.lower().split("x")
        if not all(d.isdigit() and int(d) > 0 for d in dims):
            raise argparse.ArgumentTypeError(f"{item!r} is not a shape such as 1024x1000 "
                                             "(positive integers)")
        shapes.append(tuple(map(int, dims)))
    return shapes


def _param(text: str) -> tuple[str, list[Any]]:
    """``check --param NAME=V1,V2``: a parameter's values (Python literals, else text)."""
    name, _, values = text.partition("=")
    if not name.isidentifier() or not values:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE[,VALUE...]")
    return name, [_literal(value) for value in values.split(",")]


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _check_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="FILE.py:TEMPLATE",
                        help="a CuteDSLTemplate, by its file and its name there")
    parser.add_argument("--shapes", required=True, type=_tensor_shapes, metavar="SHAPE,...",
                        help="each input's shape in def_kernel's order, e.g. 1024x1000,1024x1000")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"),
                        help="the inputs' and output's dtype (default: bfloat16)")
    parser.add_argument("--output-shape", type=lambda text: _tensor_shapes(text)[0],
                        metavar="SHAPE", help="default: the first input's shape")
    parser.add_argument("--param", action="append", type=_param, default=[],
                        metavar="NAME=V1,V2", help="a parameter's values (repeat it; a choice "
                        "per combination)")
    parser.add_argument("--arch", default="sm_90a", type=_arch)


def _precompile(args: argparse.Namespace) -> int:
    precompile = _loaded(".precompile").precompile
    summary = precompile(_as_a_gpu_compiles(args.arch), args.templates, args.gemm_shapes)
    print(summary)
    return 1 if summary.failed or not summary.offered else 0


def _as_a_gpu_compiles(arch: str) -> str:
    """``--arch`` as a process on that GPU compiles for it, said in one line where that
    differs: sm_90 is taken as sm_90a, since a process on a Hopper GPU looks its kernels
    up for sm_90a (and the GEMM needs it), so kernels for sm_90 would never be loaded."""
    from .compile import compiler  # imports torch: the package is loaded by now

    found = re.fullmatch(r"sm_([0-9]+)([0-9])", arch)
    gpu = found and compiler.gpu_arch(int(found[1]), int(found[2]))
    if not gpu or gpu == arch or gpu not in compiler.cute_archs():
        return arch
    print(f"--arch {arch} taken as {gpu}: a process on that GPU compiles for {gpu} and looks "
          f"its kernels up so (set cutedsl_inductor.config.arch={arch!r} there to use "
          f"{arch})", file=sys.stderr)
    return gpu


def _demo(args: argparse.Namespace) -> int:
    return _loaded(".demo").main()


def _check(args: argparse.Namespace) -> int:
    return _loaded(".check").main(args)


def _bench(module: str) -> Any:
    """A benchmark's ``main``, its module loaded when it runs."""
    return lambda args: _loaded(f".bench.{module}").main(args)


class _Version(argparse.Action):
    """``--version``: this package's version and those of its toolchain."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the versions and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        found = versions.toolchain_versions()
        torch = importlib.metadata.version("torch")  # what is installed, not imported
        print(f"cutedsl-inductor {__version__} (torch {torch}, nvidia-cutlass-dsl "
              f"{found['nvidia-cutlass-dsl']}, apache-tvm-ffi {found['apache-tvm-ffi']})")
        parser.exit()


def parser(prog: str = "cutedsl-inductor", argv: list[str] = ()) -> argparse.ArgumentParser:
    """The parser for ``argv``: a benchmark's own options only where ``argv`` names it
    (``bench NAME ...``)."""
    argv = [arg for arg in argv if not arg.startswith("-")]
    parser = argparse.ArgumentParser(prog=prog, description="CuTe DSL templates as "
                                     "autotuning choices inside torch.compile")
    parser.add_argument("--version", action=_Version)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser("demo", help="compile and run the example").set_defaults(run=_demo)
    cache = commands.add_parser("cache", help="inspect or clear the kernel cache")
    cache.add_argument("action", choices=["info", "clear"])
    cache.add_argument("--verify", action="store_true",
                       help="info: also read each entry's files and check their digests")
    cache.set_defaults(run=_cache)
    pre = commands.add_parser("precompile", help="fill the kernel cache, GPU or not")
    pre.add_argument("--arch", default="sm_90a", type=_arch)
    pre.add_argument("--templates", default=tuple(BUILTIN_TEMPLATES), type=_templates,
                     help="comma-separated built-in templates (default: all)")
    pre.add_argument("--gemm-shapes", type=_gemm_shapes, metavar="MxNxK,...|suite",
                     help="the GEMM choices for these shapes (default: one 4096^3 problem)")
    pre.set_defaults(run=_precompile)
    checking = commands.add_parser(
        "check", help="compile a template's choices without a GPU: registers, shared "
        "memory, spills", description="Render and compile each choice of a template for an "
        "arch, without a GPU, and report each kernel's registers, shared memory and spills, "
        "or the error and the generated file's line (docs/templates.md).")
    _check_arguments(checking)
    checking.set_defaults(run=_check)
    bench = commands.add_parser("bench", help="the benchmarks (GPU)")
    benches = bench.add_subparsers(dest="bench", required=True, metavar="BENCH")
    for name, (module, summary) in BENCHES.items():
        sub = benches.add_parser(name, help=summary, description=summary)
        if argv[:2] == ["bench", name]:  # its options: only for the benchmark being run
            _loaded(f".bench.{module}").add_arguments(sub)
        sub.set_defaults(run=_bench(module))
    return parser


def main(argv: list[str] | None = None, prog: str = "cutedsl-inductor") -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parser(prog, argv).parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
