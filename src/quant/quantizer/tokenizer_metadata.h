// The tokenizer.ggml.* metadata of a deepseek4 container, from the checkpoint's HF
// tokenizer.json: model "gpt2" (byte-level BPE), pre-tokenizer "joyai-llm" (llama.cpp's
// name for the V4 split rules), tokens by id, token types, merges. Ids are dense: holes
// up to max(vocab_size, highest id + 1) become "[PAD<id>]" of type UNUSED, as llama.cpp's
// converter writes them. bos/eos ids are written with the architecture (config_gguf).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "affinity/status.h"
#include "format/gguf_value.h"

namespace aff::quant {

// llama.cpp token types (llama_token_type / gguf-py TokenType).
enum class GgufTokenType : int32_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

// Parses tokenizer.json text (`source` names it in errors) into ordered GGUF metadata.
// Added tokens flagged special become CONTROL, the others USER_DEFINED.
Result<std::vector<std::pair<std::string, format::GgufValue>>> tokenizer_gguf_metadata(
    std::string_view json_text, const std::string& source, int64_t vocab_size);

}  // namespace aff::quant
