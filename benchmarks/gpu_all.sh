#!/usr/bin/env bash
# Every GPU test and benchmark in one call (for the H200 device; see README):
#   bash benchmarks/gpu_all.sh [step ...]     steps: precompiled pytest demo launch bench_gemm
#                                             bench_epilogue (the default: these six)
#                                             splitk, pingpong (those GPU tests alone)
#                                             bench_gemm_shards bench_epilogue_shards
#                                             bench_attention (ATTENTION_ARGS, default --quick)
#                                             bench_attention_shards (the full suite, merged)
#                                             sdpa (the SDPA choice set's GPU tests), bench_sdpa
#                                             (it timed, config.sdpa on, vs eager SDPA flash and
#                                             cuDNN and ours: --quick causal, fwd and bwd)
#                                             sweep (SWEEP_ARGS: bench sweep's arguments)
#                                             epilogue_cost (what a fused epilogue costs per config)
#                                             autotune_cost (a cold GEMM autotuning, by kind of choice)
#                                             compile_workers (host CPUs only, no GPU)
#                                             model_cold (Llama prefill, cold and warm, with
#                                             and without Triton's GEMMs beside ours)
#                                             pdl (the PDL GEMMs' GPU test, then Llama decode
#                                             with and without CUDA graphs, PDL off and on)
#                                             attention_levers (bench attention --quick, each
#                                             lever off and on: the backward's fused dQ,
#                                             longest-first dK/dV order and early S^T,
#                                             the forward's ping-pong, the persistent
#                                             forward, the forward's folded scale;
#                                             ATTENTION_ARGS as above, LEVERS (default
#                                             all six, e.g. FLEX_PERSISTENT:fwd),
#                                             LEVER_VARIANTS default ours,triton,sdpa-cudnn)
#                                             attention_profile (the backward on causal, two
#                                             kernels and fused dQ, each variant's kernels
#                                             under torch.profiler: bench attention --profile)
#                                             model (benchmarks/model_gpu.sh: Llama prefill
#                                             and real decode, twice, the runs compared)
#                                             checks (the GPU tests of attention, SDPA, real
#                                             models, FP8 and AOT in seven pytest processes
#                                             side by side, CHECKS_TIMEOUT s each, default 490:
#                                             correctness only, no timings in that step;
#                                             CHECKS: which of sdpa attention models models2
#                                             e2e fp8 aot (the default) and splitk persistent
#                                             bwd_levers (the split-K and swap-AB GEMMs, the
#                                             persistent forward, the backward's new knobs);
#                                             on an H100 seven at once ran a training test
#                                             out of memory)
#                                             aot (the AOTInductor GPU tests, then bench aot:
#                                             a Llama packaged with and without our kernels,
#                                             prefill 4x2048 and decode batch 8; AOT_ARGS)
#                                             aot_debug (benchmarks/aot_debug.py, ~3 min: small
#                                             packages with and without our kernels loaded
#                                             where CuTe DSL does not import; a child killed
#                                             by a signal rerun under gdb and LD_DEBUG; also
#                                             loads AOT_DEBUG_PACKAGES, default the packages
#                                             an earlier aot or bench aot left in $OUT/aot)
# precompiled: tests/gpu/test_precompiled.py (a cache precompiled here with the GPU hidden,
# and .device/precompiled where that folder came along); pytest: every GPU test
# (PYTEST_ARGS: other paths or options, e.g. "-n 8 tests/gpu" with pytest-xdist). A pytest
# run past PYTEST_TIMEOUT seconds is interrupted (SIGINT), so that it still prints its
# summary: the failures and their short tracebacks up to there.
# bench_gemm_shards (bench_epilogue_shards) runs shard SHARD_FIRST.. of SHARDS (env) of the
# full suite, one per GPU in parallel, into $OUT/gemm_shard_K ($OUT/epilogue_shard_K); merge
# the GEMM ones with `bench gemm --merge DIR ...`; the attention ones are merged into
# $OUT/attention (`bench attention --merge`).
# Logs and tables go to $OUT (default /tmp/gpu-out). A failing step
# does not stop the next one; the exit status says whether any failed.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
# Kernels precompiled without a GPU (CUTEDSL_INDUCTOR_CACHE_DIR=.device/precompiled python -m
# cutedsl_inductor precompile --arch sm_90a --gemm-shapes suite: 2 min, 7 MB) load, not compile.
# tests/gpu/test_precompiled.py checks that this cache serves the GPU without compiling.
if [ -d .device/precompiled ]; then
  export CUTEDSL_INDUCTOR_CACHE_DIR=$PWD/.device/precompiled
  export CUTEDSL_INDUCTOR_TEST_PRECOMPILED=$CUTEDSL_INDUCTOR_CACHE_DIR
fi
export PYTHONUNBUFFERED=1
status=0
shards() {  # shards BENCH: one shard of `bench BENCH` per GPU, in parallel
  local gpus k
  gpus=$(nvidia-smi -L | wc -l)
  for g in $(seq 0 $((gpus - 1))); do
    k=$(( ${SHARD_FIRST:-1} + g ))
    CUDA_VISIBLE_DEVICES=$g python3 -m cutedsl_inductor bench "$1" --shard "$k/${SHARDS:-$gpus}" \
      ${BENCH_ARGS:-} --out "$OUT/$1_shard_$k" > "$OUT/$1_shard_$k.log" 2>&1 &
  done
  wait || status=1
  tail -n 3 "$OUT"/"$1"_shard_*.log
}
step() {
  local name=$1; shift
  echo "=== $name: $*"
  "$@" > "$OUT/$name.log" 2>&1 || { status=1; echo "!!! $name failed"; }
  tail -n "${TAIL:-25}" "$OUT/$name.log"
}
steps=${*:-precompiled pytest demo launch bench_gemm bench_epilogue}
gpu_tests() {
  timeout -s INT -k 30 "${PYTEST_TIMEOUT:-3000}" \
    python3 -m pytest -m gpu -q -rfE --tb=short -p no:cacheprovider "$@"
}
check_job() {  # check_job NAME PYTEST-ARGS...: one of ``checks``' processes
  local name=$1; shift
  PYTEST_TIMEOUT=${CHECKS_TIMEOUT:-490} gpu_tests "$@" > "$OUT/checks_$name.log" 2>&1
  echo $? > "$OUT/checks_$name.rc"
}
checks() {  # several GPU test files at once: their compiles share the host's CPUs
  local name
  for name in ${CHECKS:-sdpa attention models models2 e2e fp8 aot}; do
    case $name in
      sdpa) check_job sdpa tests/gpu/test_sdpa.py & ;;
      attention) check_job attention tests/gpu/test_attention.py \
          -k "fused or (pingpong and 1000) or backward_causal or training_step" & ;;
      models) check_job models tests/gpu/test_models.py -k "not no-fusion" & ;;
      models2) check_job models2 tests/gpu/test_models.py -k "no-fusion" & ;;
      e2e) check_job e2e tests/gpu/test_e2e.py & ;;
      fp8) check_job fp8 tests/gpu/test_fp8.py & ;;
      aot) check_job aot tests/gpu/test_aot.py & ;;
      splitk) check_job splitk tests/gpu/test_gemm.py -k "split_k or small_m or swap_ab" & ;;
      persistent) check_job persistent tests/gpu/test_attention.py -k persistent & ;;
      bwd_levers) check_job bwd_levers tests/gpu/test_attention.py -k dkdv_levers & ;;
      *) echo "unknown check $name"; status=1 ;;
    esac
  done
  wait
  for name in ${CHECKS:-sdpa attention models models2 e2e fp8 aot}; do
    [ -f "$OUT/checks_$name.rc" ] || continue
    [ "$(cat "$OUT/checks_$name.rc")" = 0 ] || status=1
    echo "=== checks $name: rc $(cat "$OUT/checks_$name.rc")"
    grep -vE "^\s*$|[Ww]arn|DEBUG" "$OUT/checks_$name.log" | tail -n 20
  done
}
nvidia-smi -L
for s in $steps; do
  case $s in
    precompiled) step precompiled gpu_tests tests/gpu/test_precompiled.py ;;
    pytest) step pytest gpu_tests ${PYTEST_ARGS:-tests} ;;
    demo) step demo python3 -m cutedsl_inductor demo ;;
    launch) step launch python3 -m cutedsl_inductor bench launch --out "$OUT" ;;
    bench_gemm) step bench_gemm python3 -m cutedsl_inductor bench gemm \
        ${BENCH_ARGS:---quick --dtypes bf16 --layouts nt} --out "$OUT" ;;
    bench_epilogue) step bench_epilogue python3 -m cutedsl_inductor bench epilogue \
        ${EPILOGUE_ARGS:---quick} --out "$OUT" ;;
    splitk) step splitk gpu_tests tests/gpu/test_gemm.py -k "split_k or small_m" ;;
    pingpong) step pingpong gpu_tests tests/gpu/test_gemm.py -k pingpong ;;
    sweep) step sweep python3 -m cutedsl_inductor bench sweep \
        ${SWEEP_ARGS:---shapes 128x4096x4096,256x4096x14336 --layouts nt,nn --variant tile_k=128} ;;
    epilogue_cost) step epilogue_cost python3 -m benchmarks.epilogue_cost ;;
    autotune_cost) step autotune_cost python3 -m benchmarks.autotune_cost ;;
    compile_workers) step compile_workers python3 -m benchmarks.compile_workers --workers 2,8 ;;
    model_cold) step model_cold python3 -m cutedsl_inductor bench model --families llama \
        --workloads prefill --variants max-autotune,cutedsl,cutedsl-no-triton \
        --out "$OUT/model_cold" ;;
    pdl) step pdl_test gpu_tests tests/gpu/test_gemm.py -k pdl
        step pdl_model python3 -m cutedsl_inductor bench model --families llama \
        --workloads decode --contexts 1024 --batches 1,64 --graphs off,on \
        --variants max-autotune,cutedsl --pdl off,on --no-first-calls --profile 5 \
        --out "$OUT/pdl_model" ;;
    model) step model bash benchmarks/model_gpu.sh ;;
    checks) checks ;;
    aot) step aot_test gpu_tests tests/gpu/test_aot.py
        step aot python3 -m cutedsl_inductor bench aot ${AOT_ARGS:-} --out "$OUT/aot" ;;
    aot_debug) TAIL=${TAIL:-120} step aot_debug python3 -m benchmarks.aot_debug \
        --out "$OUT/aot_debug" ${AOT_DEBUG_PACKAGES:-$(ls "$OUT"/aot/cutedsl-bench-aot-*/*.pt2 2>/dev/null)} ;;
    bench_gemm_shards) shards gemm ;;
    bench_epilogue_shards) shards epilogue ;;
    bench_attention) step bench_attention python3 -m cutedsl_inductor bench attention \
        ${ATTENTION_ARGS:---quick} --out "$OUT" ;;
    attention_levers)
      for lever in ${LEVERS:-FLEX_BWD_FUSED_DQ:bwd FLEX_BWD_LPT:bwd FLEX_BWD_EARLY_S:bwd FLEX_PINGPONG:fwd FLEX_PERSISTENT:fwd FLEX_FOLD_SCALE:fwd}; do
        for on in 0 1; do
          env "CUTEDSL_INDUCTOR_${lever%:*}=$on" python3 -m cutedsl_inductor bench attention \
            ${ATTENTION_ARGS:---quick} --directions "${lever#*:}" --variants "${LEVER_VARIANTS:-ours,triton,sdpa-cudnn}" \
            --out "$OUT/${lever%:*}_$on" > "$OUT/${lever%:*}_$on.log" 2>&1 || status=1
          echo "=== ${lever%:*}=$on"; tail -n "${TAIL:-12}" "$OUT/${lever%:*}_$on.log"
        done
      done ;;
    attention_profile)
      for on in 0 1; do
        CUTEDSL_INDUCTOR_FLEX_BWD_FUSED_DQ=$on step "attention_profile_$on" python3 -m \
          cutedsl_inductor bench attention --quick --masks causal --directions bwd \
          --variants "${LEVER_VARIANTS:-ours,triton,flash}" --profile 5 \
          --out "$OUT/attention_profile_$on"
      done ;;
    sdpa) step sdpa gpu_tests tests/gpu/test_sdpa.py tests/bench/test_attention.py -k sdpa ;;
    bench_sdpa) step bench_sdpa python3 -m cutedsl_inductor bench attention --quick \
        --masks causal --variants sdpa-flash,sdpa-cudnn,sdpa-choice,ours ${SDPA_ARGS:-} \
        --out "$OUT/sdpa" ;;
    bench_attention_shards) shards attention
        step attention_merge python3 -m cutedsl_inductor bench attention --merge \
          "$OUT"/attention_shard_*/ --out "$OUT/attention" ;;
    *) echo "unknown step $s"; status=1 ;;
  esac
done
exit $status
