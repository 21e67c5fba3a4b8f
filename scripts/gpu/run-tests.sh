#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: builds with CUDA (build-gpu/), runs the GPU
# test label (ctest -L gpu) and aff-gpucheck on the tiny trained model, and
# prints a short summary table last. Exit status is non-zero if either fails.
#
#   scripts/gpu/run-tests.sh [MODEL]      (MODEL defaults to models/tiny-v4)
#
# Environment: BUILD_DIR (default build-gpu), JOBS (default nproc).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
build=${BUILD_DIR:-build-gpu}
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}
model=${1:-models/tiny-v4}

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DAFFINITY_CUDA=ON >/dev/null || exit 1
cmake --build "$build" -j"$jobs" --target test_gpu aff-gpucheck || exit 1

(cd "$build" && ctest -L gpu --output-on-failure --timeout 900) 2>&1 | tee "$build/gpu-tests.log"
tests_rc=${PIPESTATUS[0]}
"$build/bin/aff-gpucheck" -m "$model" 2>&1 | tee "$build/gpucheck.log"
check_rc=${PIPESTATUS[0]}

echo
echo "== GPU summary =="
printf '%-28s %s\n' "ctest -L gpu" "$([ "$tests_rc" = 0 ] && echo pass || echo "FAIL ($tests_rc)")"
grep -E '^\[(golden-gpu|tiny-gpu)\]' "$build/gpu-tests.log" | sed 's/^/  /'
printf '%-28s %s\n' "aff-gpucheck $model" "$([ "$check_rc" = 0 ] && echo pass || echo "FAIL ($check_rc)")"
grep -E 'checks, [0-9]+ failed' "$build/gpucheck.log" | sed 's/^/  /'
[ "$tests_rc" = 0 ] && [ "$check_rc" = 0 ]
