#!/usr/bin/env bash
# Builds the GGUF reader libFuzzer target with clang (ASan + UBSan) and runs it for a
# bounded time: scripts/fuzz-gguf.sh SECONDS [extra libFuzzer args]. Exit status is
# non-zero if the fuzzer finds a crash, leak, sanitizer report or timeout; the reproducer
# is left in build-fuzz/ (crash-*, leak-*, timeout-*).
# Needs clang and the libFuzzer runtime (Debian: clang libclang-rt-14-dev).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:?usage: scripts/fuzz-gguf.sh SECONDS [libFuzzer args]}
shift
cxx=${CXX_FUZZ:-clang++}
out=${AFF_FUZZ_BUILD_DIR:-build-fuzz}
mkdir -p "$out/corpus"
q=src/quant
srcs=(fuzz/gguf_reader_fuzz.cpp src/format/gguf_reader.cpp src/format/gguf_value.cpp
      src/format/mapped_file.cpp src/core/dtype.cpp $q/codec.cpp $q/type_traits.cpp
      $q/scale_search.cpp $q/q8_0.cpp $q/mxfp4.cpp $q/k_quants.cpp $q/iq1.cpp $q/iq2.cpp
      $q/iq3.cpp $q/iq4.cpp $q/quantizer/iq_grid_index.cpp $q/quantizer/iq_fit.cpp
      $q/quantizer/iq1_quantize.cpp $q/quantizer/iq2_quantize.cpp $q/quantizer/iq3_quantize.cpp)
"$cxx" -std=c++20 -O1 -g -fno-omit-frame-pointer \
  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -Iinclude -Isrc "${srcs[@]}" -lfmt -o "$out/gguf_reader_fuzz"
# Seed with real GGUF files (one written by the gguf Python package).
cp -n tests/data/quant/*.gguf "$out/corpus/" 2>/dev/null || true
cd "$out"
./gguf_reader_fuzz corpus -max_total_time="$seconds" -max_len=65536 -timeout=10 \
  -rss_limit_mb=2048 -print_final_stats=1 "$@"
