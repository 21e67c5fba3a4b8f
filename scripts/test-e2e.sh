#!/usr/bin/env bash
# End-to-end server tests with real clients: the official `openai` Python package
# and headless Chromium, against `affinity` serving the embedded tiny model.
# Expects build/bin/affinity (scripts/build.sh). Installs its own test packages.
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=(python3-venv python3-pip chromium chromium-driver python3-selenium)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# Debian's python, so that Debian's selenium is importable next to the pip packages.
venv=build/e2e-venv
if [ ! -x "$venv/bin/pytest" ]; then
  /usr/bin/python3 -m venv --system-site-packages "$venv"
  "$venv/bin/pip" install -q openai pytest
fi
AFF_E2E_AFFINITY_BIN="$PWD/build/bin/affinity" AFF_E2E_MODEL="$PWD/models/tiny-v4" \
  "$venv/bin/pytest" -q tests/e2e_server
