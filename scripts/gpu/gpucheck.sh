#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: builds aff-gpucheck with CUDA (if needed) and
# compares every op, single layers and the whole model on GPU vs the CPU
# reference for MODEL (default models/tiny-v4). Extra args go to aff-gpucheck.
#
#   scripts/gpu/gpucheck.sh [MODEL] [--verbose] [--seed N] ...
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
build=${BUILD_DIR:-build-gpu}
model=${1:-models/tiny-v4}
[ $# -gt 0 ] && shift
if [ ! -x "$build/bin/aff-gpucheck" ]; then
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DAFFINITY_CUDA=ON >/dev/null
    cmake --build "$build" -j"${JOBS:-$(nproc 2>/dev/null || echo 2)}" --target aff-gpucheck
fi
exec "$build/bin/aff-gpucheck" -m "$model" "$@"
