#!/usr/bin/env bash
# On the GPU machine's host (or any x86-64 box): builds the CPU lane without CUDA, checks
# its kernels on this CPU (test_cpu), then runs aff-bench-cpu on expert-shaped weights
# (2048 x 4096, V4-Flash's routed-expert projections) with 1 thread and all cores, each
# against a streaming read measured in the same run. Acceptance for issue 4: the
# selected kernels' all-core GB/s >= 60% of the all-core stream read.
#
#   scripts/gpu/bench-cpu-lane.sh [extra aff-bench-cpu args, e.g. --types IQ2_XXS,Q2_K]
#
# Environment: BUILD_DIR (default build-cpulane-bench), JOBS (default 16), THREADS
# (default: all cores), MIB (weights per type, default 2048: well past any L3), OUT
# (if set, the log is also written to $OUT/bench-cpu-lane.txt), BIN_DIR (run prebuilt
# test_cpu and aff-bench-cpu from there instead of building: a directory made by
# scripts/gpu/bundle.sh, whose `run` wrapper supplies the libraries the host lacks),
# COMMIT (the commit to print when the tree has no .git, e.g. with BIN_DIR).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
build=${BUILD_DIR:-build-cpulane-bench}
jobs=${JOBS:-16}
threads=${THREADS:-$(nproc 2>/dev/null || echo 1)}
mib=${MIB:-2048}
log=$(mktemp)
trap 'rm -f "$log"' EXIT

if [ -n "${BIN_DIR:-}" ]; then
    bin_dir=$(cd "$BIN_DIR" && pwd)
    run_bin() {
        if [ -x "$bin_dir/run" ]; then "$bin_dir/run" "$@"; else "$bin_dir/$1" "${@:2}"; fi
    }
else
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DAFFINITY_CUDA=OFF >/dev/null
    cmake --build "$build" -j"$jobs" --target aff-bench-cpu test_cpu >/dev/null
    run_bin() { "$root/$build/bin/$1" "${@:2}"; }
fi
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}

# One thread per core, packed, so the all-core stream and the kernels see the same
# placement.
export OMP_PROC_BIND=${OMP_PROC_BIND:-close} OMP_PLACES=${OMP_PLACES:-cores}
set +e
{
    set -e
    echo "== $(date -u +%FT%TZ)  commit $commit"
    lscpu 2>/dev/null | grep -E '^(Model name|Socket|Core|Thread|CPU\(s\)|L2|L3|NUMA node\(s\))' || true
    echo "== test_cpu"
    run_bin test_cpu --gtest_brief=1 2>&1 | tail -n 3
    echo "== aff-bench-cpu --threads $threads --mib $mib $*"
    run_bin aff-bench-cpu --threads "$threads" --mib "$mib" "$@"
} 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    cp "$log" "$OUT/bench-cpu-lane.txt"
fi
exit "$status"
