#!/usr/bin/env bash
# One decode step's kernel timeline on a GPU machine: affinity-bench from a bundle made by
# scripts/gpu/bundle.sh, run with AFF_CUDA_TRACE, then scripts/gpu/trace-step.py over it.
# Writes OUT/trace.csv.xz (every kernel of the run), OUT/bench.txt and OUT/step.txt (the
# step's per-kernel, per-layer and per-kind tables); prints the per-layer and per-kind parts.
#
#   BIN_DIR=.devpack scripts/gpu/trace-decode.sh OUT [BENCH_ARGS...]
#
# Default bench arguments: the issue-5 decode geometry at context 4096, 4 decode steps, one
# run. AFF_CUPTI_LIB names CUPTI when it is not on the loader's path; otherwise the CUDA
# toolkit's usual places are tried.
set -euo pipefail
bin=$(cd "${BIN_DIR:?set BIN_DIR to a bundle made by scripts/gpu/bundle.sh}" && pwd)
out=${1:?usage: trace-decode.sh OUT [BENCH_ARGS...]}
shift
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--layers 43 --kv-size 65536 --expert-types Q2_K,Q3_K --contexts 4096 --prefill none
                               --decode-steps 4 --runs 1)
if [ -z "${AFF_CUPTI_LIB:-}" ]; then
    for lib in /usr/local/cuda/lib64/libcupti.so /usr/local/cuda/extras/CUPTI/lib64/libcupti.so; do
        if [ -e "$lib" ]; then export AFF_CUPTI_LIB=$lib; break; fi
    done
fi
mkdir -p "$out"
rm -f "$out/trace.csv" "$out/trace.csv.xz"
AFF_CUDA_TRACE="$out/trace.csv" "$bin/run" affinity-bench "${args[@]}" > "$out/bench.txt" 2>&1 ||
    { echo "trace-decode: affinity-bench failed (see $out/bench.txt)" >&2; tail -5 "$out/bench.txt" >&2; exit 1; }
[ -s "$out/trace.csv" ] || { echo "trace-decode: no trace written (see $out/bench.txt)" >&2; exit 1; }
python3 "$(dirname "$0")/trace-step.py" "$out/trace.csv" > "$out/step.txt"
sed -n '/^launch/p; /^per layer/,/^window/p' "$out/step.txt" | sed '$d'
if command -v xz > /dev/null; then xz -f "$out/trace.csv"; fi
