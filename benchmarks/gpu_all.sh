#!/usr/bin/env bash
# Every GPU test and benchmark in one call (for the H200 device; see README).
# Logs and tables go to $OUT (default /tmp/gpu-out). A failing step does not stop the
# next one; the exit status says whether any failed.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
status=0
step() {
  local name=$1; shift
  echo "=== $name: $*"
  "$@" > "$OUT/$name.log" 2>&1 || { status=1; echo "!!! $name failed"; }
  tail -n "${TAIL:-25}" "$OUT/$name.log"
}
nvidia-smi -L
python3 -c "import torch, cutlass; print('torch', torch.__version__)"
if [ -d .device/precompiled ]; then
  step precompiled env CUTEDSL_INDUCTOR_CACHE_DIR=.device/precompiled \
    python3 benchmarks/check_precompiled.py
fi
step pytest python3 -m pytest -m gpu -q tests -p no:cacheprovider --continue-on-collection-errors
step demo python3 -m cutedsl_inductor demo
step launch python3 benchmarks/launch_overhead.py --out "$OUT"
for extra in "$@"; do step "$(basename "$extra" .py)" python3 "$extra" --out "$OUT"; done
exit $status
