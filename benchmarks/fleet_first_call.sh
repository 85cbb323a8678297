#!/usr/bin/env bash
# Issue #37 on a GPU machine: two "machines" (fresh local caches each: bench model makes
# them per run) sharing one Redis, Llama prefill, max-autotune (Inductor's remote caches:
# FX graph, autotune and AOT autograd, the last sparing a remote-warm process AOT autograd's
# trace as the local one spares a warm one; AUTOGRAD_REMOTE=0 leaves it off) and cutedsl
# (ours too: CUTEDSL_INDUCTOR_REMOTE_CACHE=1). TRITON_REMOTE=1 adds Triton's own Redis
# cache (its RemoteCacheManager) for both variants, for the Triton kernels that a
# remote-warm process compiles although the FX graph's Triton bundle was applied (through
# benchmarks/triton_redis.py: Triton 3.6's own Redis backend cannot start). Run 1:
# cold, then local-warm; run 2: its cold process is remote-warm, then local-warm. Each
# first call's breakdown is the "first call" lines under each row (bench/first_call.py).
#
# From the repository root, carrying .device/b .device/r (install.sh, its wheels; the
# redis wheel and server .debs); $OUT collects the logs, CSVs and the children's logs.
# RUNS: which runs (default "1 2"; "1" then "2" in two calls on the same machine: Redis
# keeps running between them). RUN_S: each run's limit (default 330 s, room for run 1's
# two cold compiles). A run past it is ended whole: setsid gives it a session, timeout
# signals that process group (TERM, KILL 5 s later), and every process still carrying the
# run's tag in its environment (one in a session of its own, or one that survived TERM)
# is ended by its pid.
set -u
. .device/b/install.sh
python3 -m pip install -q --no-index --no-deps --target /root/site2 .device/r/*.whl 2>&1 | tail -2
export PYTHONPATH=$PYTHONPATH:/root/site2
mkdir -p /root/redis && for d in .device/r/*.deb; do dpkg -x "$d" /root/redis; done
export LD_LIBRARY_PATH=/root/redis/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
if ! /root/redis/usr/bin/redis-cli -p 6390 ping >/dev/null 2>&1; then
  /root/redis/usr/bin/redis-server --port 6390 --bind 127.0.0.1 --save '' --daemonize yes \
    --logfile /root/redis/redis.log; sleep 1
fi
export TORCHINDUCTOR_REDIS_PORT=6390 CUTEDSL_INDUCTOR_REMOTE_CACHE=1 \
  TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE=1 TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE=1 \
  TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE=${AUTOGRAD_REMOTE:-1}
if [ "${TRITON_REMOTE:-0}" = 1 ]; then
  export TRITON_CACHE_MANAGER=triton.runtime.cache:RemoteCacheManager \
    TRITON_REMOTE_CACHE_BACKEND=benchmarks.triton_redis:RedisBackend \
    TRITON_REDIS_PORT=6390
fi

reap() {  # end every process whose environment holds the tag $1, by pid
  local pids
  pids=$(grep -lsz "^CUTEDSL_FLEET_RUN=$1\$" /proc/[0-9]*/environ | cut -d/ -f3)
  [ -z "$pids" ] && return
  echo "reaping run $1's leftover processes: $pids"
  kill -TERM $pids 2>/dev/null; sleep 5; kill -KILL $pids 2>/dev/null
}

for r in ${RUNS:-1 2}; do
  t0=$(date +%s)
  CUTEDSL_FLEET_RUN=$r setsid --wait timeout --kill-after=5 -s TERM "${RUN_S:-330}" \
    python3 -m cutedsl_inductor bench model --families llama --workloads prefill \
    --variants max-autotune,cutedsl --fusion on --layers 2 --rounds 1 --steps 1 \
    --out "$OUT/remote$r" \
    > "$OUT/remote$r.log" 2>&1
  echo "run $r rc $? in $(( $(date +%s) - t0 )) s"
  reap $r
  grep -E "^llama|first call" "$OUT/remote$r.log"
done
/root/redis/usr/bin/redis-cli -p 6390 info stats 2>/dev/null | grep -E "keyspace|total_net" || true
cp /root/redis/redis.log "$OUT/" 2>/dev/null
tar czf "$OUT/remote_logs.tgz" "$OUT"/remote*/logs 2>/dev/null
