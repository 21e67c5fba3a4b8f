#!/usr/bin/env bash
# Why a kernel is as fast as it is: Nsight Compute's throughput, memory, compute, warp-stall,
# launch and occupancy sections for the first N launches of the kernels matching a regex in
# one affinity-bench run (binaries from scripts/gpu/bundle.sh). Clocks are left as they are.
# Each profiled launch is replayed once per section pass, so keep N small.
#
#   BIN_DIR=.devpack scripts/gpu/ncu-detail.sh REGEX N REPORT.txt -- BENCH_ARGS...
#   e.g. ... 'moe_ggml' 2 moe.txt -- --layers 1 --contexts none --prefill 2048 --chunk 2048 --runs 1
set -uo pipefail
bin=$(cd "${BIN_DIR:?set BIN_DIR to a bundle made by scripts/gpu/bundle.sh}" && pwd)
regex=${1:?kernel name regex} count=${2:?launches to profile} report=${3:?report file}
shift 3
[ "${1:-}" = -- ] && shift
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
"$bin/run" affinity-bench --help > /dev/null  # unpacks the binary outside the profile
"$ncu" --clock-control none --kernel-name regex:"$regex" --launch-count "$count" \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
    --section WarpStateStats --section LaunchStats --section Occupancy \
    "$bin/run" affinity-bench "$@" > "$report" 2> "$report.err"
rc=$?
# The headline lines: duration, throughputs, pipe use, the top stall reasons.
grep -E "^  [a-z_0-9]+.*\(|Duration|Throughput|Pipe|Issue Slots|Warp Cycles Per Issued|Stall|Achieved Occupancy|Registers Per|Shared Memory Configuration Size|L1/TEX Hit|L2 Hit" \
    "$report" | head -120
exit $rc
