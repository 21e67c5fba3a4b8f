#!/usr/bin/env bash
# The whole CPU test suite: installs dependencies, builds, runs a bounded fuzz pass
# of the GGUF reader (AFF_FUZZ_SECONDS, default 60; 0 skips), every ctest test
# (all but label gpu), and the end-to-end server tests with real clients.
# GPU tests (label gpu) run only on a GPU machine: scripts/gpu/run-tests.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
fuzz_s=${AFF_FUZZ_SECONDS:-60}
if [ "$fuzz_s" -gt 0 ]; then
  # A fixed seed makes the CI pass reproducible (the inputs tried depend only on
  # the seed and on how many fit in the time); AFF_FUZZ_SEED=0 draws a new one.
  bash scripts/fuzz-gguf.sh "$fuzz_s" -seed="${AFF_FUZZ_SEED:-1}" 2>&1 | tail -4
fi
echo "GPU tests: skipped here (they need a GPU); run scripts/gpu/run-tests.sh on a GPU machine."
(cd build && ctest --output-on-failure -LE gpu -j"$(nproc 2>/dev/null || echo 2)" --timeout 900)
bash scripts/test-e2e.sh
