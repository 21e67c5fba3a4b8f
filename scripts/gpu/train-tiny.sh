#!/usr/bin/env bash
# Train the tiny V4 model on a GPU machine and collect what comes back.
#
#   scripts/gpu/train-tiny.sh OUT_DIR MINUTES [extra train.py flags...]
#
# Needs tools/tiny_model/work/data/{train,eval}.u16 and tools/tiny_model/work/tokenizer.json
# (built by tools/tiny_model: build_corpus.py, train_tokenizer.py, tokenize_corpus.py; see
# docs/tiny-model.md).  Python (torch + transformers with DeepseekV4) comes from $PYTHON or
# python3.  OUT_DIR receives the three export shards, the non-expert master weights in two float32 parts and
# meta.tar.gz (config, index, metrics, log): six files, each below 16 MB, 55 MB in all.
set -euo pipefail
out=${1:?usage: train-tiny.sh OUT_DIR MINUTES [flags]}
minutes=${2:?usage: train-tiny.sh OUT_DIR MINUTES [flags]}
shift 2
py=${PYTHON:-python3}
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$root/tools/tiny_model/work
run=$(mktemp -d)
"$py" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available())'
"$py" "$root/tools/tiny_model/train.py" --data "$work/data" --tokenizer "$work/tokenizer.json" \
    --out "$run" --minutes "$minutes" "$@"
mkdir -p "$out"
cp "$run"/export/model-*.safetensors "$run"/master-*.pt "$out"/
tar -C "$run" -czf "$out/meta.tar.gz" metrics.json train.log export/config.json \
    export/model.safetensors.index.json export/generation_config.json export/tokenizer_config.json
ls -la "$out"
