#!/usr/bin/env bash
# On the GPU machine: compare affinity against the transformers oracle (CUDA torch, float32,
# TF32 off) on the committed golden fixtures and on N fresh random V4 checkpoints.
#
#   scripts/gpu/oracle-check.sh [N] [-- extra affinity args, e.g. --prefill-chunk-size 64]
#
# Environment: PYTHON (torch with CUDA + transformers >= 5.17 + safetensors + numpy; default
# python3), AFFINITY (engine binary; default build/bin/affinity, built here with CUDA if absent),
# MAX_REL_RMS / MIN_TOP1 (default 2e-2 / 0.98: the GPU acceptance bounds; the CPU bounds are
# 5e-3 / 0.99), TORCH_DEVICE (default cuda if available), SEED (config seed; default clock).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
n=${1:-4}
[ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift
py=${PYTHON:-python3}
aff=${AFFINITY:-$root/build/bin/affinity}
if [ ! -x "$aff" ]; then
    bash "$root/scripts/build.sh" -DAFFINITY_CUDA=ON
fi
dev=${TORCH_DEVICE:-$("$py" -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')}
"$py" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available())'
seed_args=()
[ -n "${SEED:-}" ] && seed_args=(--seed "$SEED")
exec "$py" "$root/tools/oracle/check_random.py" --n "$n" --affinity "$aff" --torch-device "$dev" \
    --fixtures "$root/tests/data/golden" --max-rel-rms "${MAX_REL_RMS:-2e-2}" --min-top1 "${MIN_TOP1:-0.98}" \
    "${seed_args[@]}" -- "$@"
