#!/usr/bin/env bash
# First command of the README: install what is needed, build, and run affinity on
# the embedded default model (models/ in this tree) with a short prompt.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
build/bin/affinity -p "${1:-In the beginning}" -n "${2:-48}" --temp 0
