#!/usr/bin/env bash
# Installs the Debian packages affinity needs to build and test (run as root).
set -euo pipefail
pkgs=(build-essential cmake pkg-config git python3 ca-certificates
      nlohmann-json3-dev libfmt-dev libpcre2-dev libgtest-dev libcpp-httplib-dev
      libxxhash-dev libzstd-dev
      # clang + libFuzzer runtime: scripts/fuzz-gguf.sh (GGUF reader fuzzing)
      clang libclang-rt-14-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
