#!/usr/bin/env python3
"""Two machines sharing one Redis: a command run three times in fresh processes, each
with its own kernel cache -- cold (machine A: nothing anywhere), remote-warm (machine B:
an empty local cache, A's kernels in Redis) and local-warm (machine B again) -- with the
wall time to its result and where its CuTe kernels came from. GPU-less by default:

    redis-server --port 6390 --bind 127.0.0.1 --save '' &
    TORCHINDUCTOR_REDIS_PORT=6390 python benchmarks/remote_cache.py \\
        [-- precompile --arch sm_90a --gemm-shapes suite]

The command after ``--`` is ``python -m cutedsl_inductor <args>`` (default: the precompile
above). Our keys (``pt2:cutedsl-inductor::*``) in that Redis are deleted first, nothing
else. (``bench model`` makes fresh caches for each of its processes itself: run it twice
with ``CUTEDSL_INDUCTOR_REMOTE_CACHE=1`` against one empty Redis instead; the first run's
cold column is cold, its warm column local-warm, the second run's cold column
remote-warm.)
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = ["precompile", "--arch", "sm_90a", "--gemm-shapes", "suite"]
SUMMARY = re.compile(r"(\d+) compiled, (\d+) from the local cache, (\d+) from the remote "
                     r"cache, (\d+) failed")


def run(args: list[str], cache_dir: str) -> tuple[float, str]:
    env = dict(os.environ, CUTEDSL_INDUCTOR_CACHE_DIR=cache_dir,
               CUTEDSL_INDUCTOR_REMOTE_CACHE="1", CUTE_DSL_ARCH="sm_90a",
               TORCHINDUCTOR_CACHE_DIR=os.path.join(cache_dir, "inductor"))
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "cutedsl_inductor", *args], cwd=REPO,
                          env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return seconds, done.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs="*", default=DEFAULT)
    args = parser.parse_args(argv)
    import redis

    client = redis.Redis(host=os.environ.get("TORCHINDUCTOR_REDIS_HOST", "localhost"),
                         port=int(os.environ.get("TORCHINDUCTOR_REDIS_PORT", 6379)))
    stale = client.keys("pt2:cutedsl-inductor::*")
    if stale:
        client.delete(*stale)
    print(f"python -m cutedsl_inductor {' '.join(args.command)}")
    print(f"{'run':<12} {'seconds':>8}  compiled / local / remote / failed")
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        for name, cache_dir in (("cold", a), ("remote-warm", b), ("local-warm", b)):
            seconds, out = run(args.command, cache_dir)
            counts = SUMMARY.search(out)
            print(f"{name:<12} {seconds:8.1f}  "
                  + (" / ".join(counts.groups()) if counts else out.strip()[-200:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
