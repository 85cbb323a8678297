"""Command line: ``python -m cutedsl_inductor <command>``.

  demo                         the main job (see ``cutedsl_inductor.demo``)
  cache info | cache clear     what the kernel cache holds, and the remote tier / empty
                               the local cache (kernels and tuning decisions)
  precompile [--arch sm_90a] [--templates elementwise,gemm] [--gemm-shapes S]
                               compile the built-in templates' default choices into the
                               cache, GPU or not; S: MxNxK,... or "suite" (bench gemm's
                               shapes), the GEMM choices for those shapes
  bench gemm [--quick] ...     our GEMM vs cuBLAS and Inductor's Triton (GPU)
  bench epilogue [--quick]     fused GEMM blocks vs Inductor default / max-autotune (GPU)
  bench model [--families ...] real models (transformers) under torch.compile, with and
                               without our kernels (GPU)
"""

from __future__ import annotations

import argparse
import sys

from .autotune.precompile import BUILTIN_TEMPLATES


def _cache(args: argparse.Namespace) -> int:
    from .compile import decisions
    from .compile.disk_cache import default_cache

    cache = default_cache()
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
    entries = cache.entries()
    size = sum(entry["disk_bytes"] for entry in entries)
    print(f"cache dir: {cache.root}" + (f" ({mode.note})" if mode.note else "")
          + f"\nentries:   {len(entries)}\nsize:      {size / 1e6:.2f} MB")
    print("\n".join(cache_tiers()))
    for entry in entries:
        if entry.get("corrupt"):
            print(f"  {entry['key'][:16]}  CORRUPT manifest")
            continue
        flag = "" if entry["verified"] else "  UNVERIFIED (rebuilt when next needed)"
        print(f"  {entry['key'][:16]}  {entry.get('arch')}  {entry.get('template')}  "
              f"{entry.get('params')}{flag}")
    return 0


def cache_tiers() -> list[str]:
    """The tiers: tuning decisions stored locally, the remote tier (reachable or not) and
    this process's hits and misses in each (call it from a job to see its own)."""
    from . import config
    from .compile import compiler, decisions, remote_cache

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
    kernels, remote, tuned = compiler.stats, remote_cache.stats, decisions.stats
    lines.append(
        f"this process: kernels {kernels['disk_hits']} local hits, {kernels['remote_hits']} "
        f"remote hits, {kernels['compiled']} compiled; decisions {tuned['local_hits']} local "
        f"hits, {tuned['remote_hits']} remote hits, {tuned['misses']} misses; remote "
        f"{remote['hits']} hits, {remote['misses']} misses, {remote['rejected']} refused, "
        f"{remote['published']} published, {remote['errors']} errors")
    return lines


def _arch(text: str) -> str:
    """``--arch``: an arch CuTe DSL compiles for, checked before anything compiles."""
    from .compile.compiler import check_cute_arch
    from .exc import ConfigError

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
    from .bench.gemm import LLM, SQUARES, parse_shapes

    return SQUARES + LLM if text == "suite" else parse_shapes(text)


def _precompile(args: argparse.Namespace) -> int:
    from .autotune.precompile import precompile

    summary = precompile(args.arch, args.templates, args.gemm_shapes)
    print(summary)
    return 1 if summary.failed else 0


def _demo(args: argparse.Namespace) -> int:
    from .demo import main

    return main()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:2] == ["bench", "gemm"]:
        from .bench.gemm import main as bench_gemm

        return bench_gemm(argv[2:])
    if argv[:2] == ["bench", "epilogue"]:
        from .bench.epilogue import main as bench_epilogue

        return bench_epilogue(argv[2:])
    if argv[:2] == ["bench", "model"]:
        from .bench.model import main as bench_model

        return bench_model(argv[2:])
    parser = argparse.ArgumentParser(prog="python -m cutedsl_inductor")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="compile and run the example").set_defaults(run=_demo)
    cache = commands.add_parser("cache", help="inspect or clear the kernel cache")
    cache.add_argument("action", choices=["info", "clear"])
    cache.set_defaults(run=_cache)
    pre = commands.add_parser("precompile", help="fill the kernel cache, GPU or not")
    pre.add_argument("--arch", default="sm_90a", type=_arch)
    pre.add_argument("--templates", default=tuple(BUILTIN_TEMPLATES), type=_templates,
                     help="comma-separated built-in templates (default: all)")
    pre.add_argument("--gemm-shapes", type=_gemm_shapes, metavar="MxNxK,...|suite",
                     help="the GEMM choices for these shapes (default: one 4096^3 problem)")
    pre.set_defaults(run=_precompile)
    commands.add_parser("bench", help="bench gemm|epilogue|model: see cutedsl_inductor/bench")
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
