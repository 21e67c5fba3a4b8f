#!/usr/bin/env bash
# aff-gpucheck on GGUF containers of the committed tiny model, one per recipe, on the GPU
# machine (binaries from scripts/gpu/bundle.sh, which must hold aff-quantize and
# aff-gpucheck). The ggml experts' GEMVs quantise activations, so these runs measure the
# errors the checker's rounded-path bound (kTolRounded, op_check.h) is meant to cover.
#
#   BIN_DIR=.devpack scripts/gpu/gpucheck-containers.sh [RECIPE...]   (default: q2 q4 mxfp4)
# Prints each run's exit status and the worst error per op; logs under $OUT (or a temp dir).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=$(cd "${BIN_DIR:?set BIN_DIR to a bundle made by scripts/gpu/bundle.sh}" && pwd)
logs=${OUT:-$(mktemp -d)}
work=$(mktemp -d)
recipes=("$@")
[ ${#recipes[@]} -gt 0 ] || recipes=(q2 q4 mxfp4)
status=0
for r in "${recipes[@]}"; do
    gguf="$work/tiny-$r.gguf"
    if ! "$bin/run" aff-quantize --src "$root/models/tiny-v4" --out "$gguf" --recipe "$r" > "$logs/quantize-$r.txt" 2>&1; then
        echo "quantize $r: failed (log $logs/quantize-$r.txt)"; status=1; continue
    fi
    for seed in 1 2; do
        timeout 120 "$bin/run" aff-gpucheck -m "$gguf" --seed "$seed" > "$logs/gpucheck-$r-$seed.txt" 2>&1
        rc=$?
        echo "gpucheck $r seed $seed: rc $rc"
        [ "$rc" = 0 ] || status=1
    done
    tail -n 40 "$logs/gpucheck-$r-1.txt"
done
rm -rf "$work"
exit $status
