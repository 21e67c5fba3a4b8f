#!/usr/bin/env bash
# One call's worth of checks and timings on the GPU machine, from binaries packed by
# scripts/gpu/bundle.sh into BIN_DIR (the machine has no C++ toolchain dependencies):
#   1. test_gpu in the exact precision (every kernel vs the CPU reference, golden fixtures,
#      tiny model, decode graph, KV growth, decode MoE), line-buffered and time-limited;
#   2. the kernel timing tests (disabled by default): both forms of the fused MoE prefill
#      kernels against the per-expert path, the prefill mHC site and qkv_finish;
#   3. the model-level GPU tests again in the fast precision (AFF_CUDA_PRECISION=bf16), whose
#      acceptance bounds are golden rel RMS <= 2e-2 / top-1 >= 98% and tiny-model top-1 >= 99%,
#      perplexity within 1%;
#   4. affinity-bench on the full 43-layer geometry: decode at 4K (Q2_K/Q3_K and IQ2_XXS
#      experts), prefill at 1K and 8K in the exact setting with each MoE prefill form, and in
#      the fast setting;
#   (4 is skipped with SKIP_BENCH=1)
#   5. unless SKIP_CPU=1, the CPU lane bench on this host (scripts/gpu/bench-cpu-lane.sh).
# Logs go to one archive, $OUT/device-check.tgz (when OUT is set: the transfer keeps few
# files), and a summary is printed last.
#
#   BUNDLE_XZ=1 scripts/gpu/bundle.sh build-cuda .devpack test_gpu affinity-bench affinity
#   BUNDLE_XZ=1 scripts/gpu/bundle.sh build-cpulane .devpack aff-bench-cpu test_cpu   (CPU-only build)
#   BIN_DIR=.devpack scripts/gpu/device-check.sh
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
bin=$(cd "${BIN_DIR:?set BIN_DIR to a bundle made by scripts/gpu/bundle.sh}" && pwd)
logs=$(mktemp -d)
run=(stdbuf -oL -eL "$bin/run")  # line-buffered, so a timed-out run still leaves its log
summary=()
result() { grep -E '^\[  (PASSED|FAILED)  \]' "$1" | tr '\n' ' '; }

# The CLI tests start the bundled CLI when the bundle has it (bundle.sh ... affinity).
[ -e "$bin/affinity" ] || [ -e "$bin/affinity.xz" ] && export AFF_TEST_AFFINITY="$bin/run affinity"
# The second MoE prefill form first, alone and briefly: a wrong barrier phase in it would
# hang or fault, and the later steps then leave it out (a fault would end every later test
# of the same process; a hang would wait out the time limits).
timeout 60 "${run[@]}" test_gpu --gtest_brief=1 --gtest_filter='MoeGroupedGgmlForms.*' > "$logs/moe_v2_smoke.txt" 2>&1
v2_rc=$?
summary+=("MoE prefill form 2 smoke (rc $v2_rc): $(result "$logs/moe_v2_smoke.txt")")
no_v2=()
[ "$v2_rc" != 0 ] && no_v2=(--gtest_filter='-Types/MoeGroupedGgml.*:MoeGroupedGgmlIdentity.*:MoeGroupedGgmlForms.*:MoeGroupedBench.*')
timeout 300 "${run[@]}" test_gpu --gtest_brief=1 "${no_v2[@]}" > "$logs/test_gpu_exact.txt" 2>&1
summary+=("test_gpu (exact, rc $?): $(result "$logs/test_gpu_exact.txt")")

timing_filter='MoeGroupedBench.DISABLED_Timing:MhcQkvBench.DISABLED_Timing'
[ "$v2_rc" != 0 ] && timing_filter='MhcQkvBench.DISABLED_Timing'
timeout 120 "${run[@]}" test_gpu --gtest_also_run_disabled_tests --gtest_filter="$timing_filter" \
    > "$logs/timing.txt" 2>&1
summary+=("kernel timings (rc $?): $(grep -E '^\[(moe-grouped-bench|bench)\]' "$logs/timing.txt" | tr -s ' ' | tr '\n' ';')")

AFF_CUDA_PRECISION=bf16 timeout 120 "${run[@]}" test_gpu --gtest_filter='Fixtures/*:TinyModelGpu.Teacher*:DecodeGraph.*' \
    > "$logs/test_gpu_fast.txt" 2>&1
summary+=("model tests (fast, rc $?): $(result "$logs/test_gpu_fast.txt")")

bench() {  # name, env, args...
    local name=$1 envs=$2
    shift 2
    env $envs timeout 150 "$bin/run" affinity-bench --layers 43 --kv-size 65536 --json "$logs/$name.json" "$@" \
        > "$logs/$name.txt" 2>&1
    summary+=("$name: $(grep -E '^ +[0-9]+ +[0-9.]+ +[0-9.]+' "$logs/$name.txt" | tr -s ' ' | tr '\n' ';')")
}
if [ "${SKIP_BENCH:-0}" != 1 ]; then
    bench q2k "" --expert-types Q2_K,Q3_K --contexts 4096 --prefill none --decode-steps 32
    bench iq2 "" --expert-types IQ2_XXS,Q2_K --contexts 4096 --prefill none --decode-steps 32
    forms=(v1 v2)
    [ "$v2_rc" != 0 ] && forms=(v1)
    for form in "${forms[@]}"; do
        bench "prefill_$form" "AFF_CUDA_MOE_PREFILL=$form" --expert-types Q2_K,Q3_K --contexts none \
            --prefill 1024,8192 --chunk 2048 --max-seconds 90
    done
    bench prefill_fast "AFF_CUDA_PRECISION=bf16" --expert-types Q2_K,Q3_K --contexts none --prefill 8192 \
        --chunk 2048 --max-seconds 60
fi

if [ "${SKIP_CPU:-0}" != 1 ]; then
    BIN_DIR=$bin MIB=1024 OUT=$logs bash scripts/gpu/bench-cpu-lane.sh \
        --types IQ2_XXS,Q2_K,Q3_K,IQ2_XS,IQ3_XXS,IQ1_S,IQ1_M --single 0 > "$logs/cpu_lane.txt" 2>&1
    echo "== cpu lane"; tail -14 "$logs/cpu_lane.txt"
fi

[ -n "${OUT:-}" ] && tar czf "$OUT/device-check.tgz" -C "$logs" .
echo "== failures (exact)"; grep -E '^\[  FAILED  \]|Failure$' "$logs/test_gpu_exact.txt" | head -20
echo "== summary"; printf '%s\n' "${summary[@]}"
