#!/usr/bin/env bash
# Installs dependencies, builds, and runs the whole CPU test suite through ctest.
# GPU tests (label gpu) run only on a machine with a GPU: scripts/gpu/run-tests.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
echo "GPU tests: skipped here (no GPU in this run); they run with scripts/gpu/run-tests.sh on a GPU machine."
cd build
ctest --output-on-failure -LE gpu -j"$(nproc 2>/dev/null || echo 2)" --timeout 900
