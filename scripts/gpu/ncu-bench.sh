#!/usr/bin/env bash
# Per-kernel GPU time of one affinity-bench run under Nsight Compute, summed per kernel
# by scripts/gpu/ncu-kernels.py. The bench's weight-synthesis kernels are left out of
# the profile (they run before any timed step and would dominate the replay time).
# The clocks are left as they are (--clock-control none), so times compare with the
# bench's own; ncu still serialises the kernels, so PDL overlap is not seen.
# ncu prints its results when the process ends: keep the run small (few layers, one
# run) or it outlasts a time limit and prints nothing.
#
#   BIN_DIR=.devpack scripts/gpu/ncu-bench.sh LOG.csv STEPS -- BENCH_ARGS...
#   e.g. ... prefill.csv 1 -- --layers 4 --contexts none --prefill 8192 --chunk 2048 --runs 1
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=$(cd "${BIN_DIR:?set BIN_DIR to a bundle made by scripts/gpu/bundle.sh}" && pwd)
log=${1:?log file} steps=${2:?steps to divide by}
shift 2
[ "${1:-}" = -- ] && shift
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
"$bin/run" affinity-bench --help > /dev/null  # unpacks the binary outside the profile
# `run` sets the library path, so ncu profiles the real binary through it.
"$ncu" --csv --metrics gpu__time_duration.sum --graph-profiling node --clock-control none \
    --kernel-name regex:'^[^s]|^s[^y]' "$bin/run" affinity-bench "$@" > "$log" 2> "$log.err"
rc=$?
python3 "$root/scripts/gpu/ncu-kernels.py" "$log" --steps "$steps"
exit $rc
