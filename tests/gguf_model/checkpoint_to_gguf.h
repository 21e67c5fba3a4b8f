// Test-side converter: an official-layout V4 checkpoint directory to a
// deepseek4 GGUF, the way llama.cpp's converter does it losslessly (FP8 dense
// weights dequantised to BF16 — exact, e4m3 x 2^k fits bf16 — MXFP4 experts
// re-packed into ggml MXFP4 blocks, tid2eid narrowed to I32), or with dense
// weights re-quantised to Q8_0. It streams one row at a time like aff-quantize;
// it exists so the loader tests do not depend on aff-quantize.
#pragma once

#include <string>

#include "affinity/status.h"

namespace aff::test {

struct CheckpointToGgufOptions {
  bool dense_q8_0 = false;   // FP8 dense Linears -> Q8_0 instead of BF16
  bool embed_q8_0 = false;   // token_embd as Q8_0 (exercises ModelWeights::embed_rows)
  // With dense_q8_0 / embed_q8_0: store the Q8_0-decoded values as F32
  // instead, the same model in plain floats (the oracle for the Q8_0 path).
  bool q8_0_decoded_as_f32 = false;
  bool with_tokenizer = true;  // copy <dir>/tokenizer.json into the tokenizer keys when present
};

Status checkpoint_to_gguf(const std::string& dir, const std::string& out_path,
                          const CheckpointToGgufOptions& options = {});

}  // namespace aff::test
