// The tokenizer inside a deepseek4 GGUF. llama.cpp carries a byte-level BPE
// tokenizer as tokenizer.ggml.{model = "gpt2", pre, tokens, token_type,
// merges}; the pre-tokenizer is only a name, so affinity knows the split
// regexes of the names V4 files use. Containers we write also carry the
// original tokenizer.json text under affinity.tokenizer.json, which is
// preferred on read: it is exact where the ggml keys lose detail (added-token
// normalized/lstrip/rstrip flags, regexes of unknown pre names).
//
// token_type (llama.cpp's llama_token_type): 1 normal, 2 unknown, 3 control,
// 4 user-defined, 5 unused, 6 byte. Read as: 1 -> vocab; 3 -> added, special;
// 4 -> added, not special, normalized (HF's default for non-special added
// tokens); 2, 5, 6 -> no token (padding ids decode to "").
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "affinity/status.h"
#include "format/gguf_reader.h"
#include "model/dsv4/config_gguf.h"
#include "tokenizer/tokenizer.h"

namespace aff::dsv4 {

inline constexpr std::string_view kGgufKeyTokenizerJson = "affinity.tokenizer.json";

// True when the file carries a tokenizer (either form above).
bool gguf_has_tokenizer(const format::GgufFile& file);

// Builds the tokenizer; not_found (saying to pass --tokenizer FILE) when the
// file carries none, unsupported for a tokenizer.ggml.model/pre we cannot run.
Result<std::unique_ptr<Tokenizer>> tokenizer_from_gguf(const format::GgufFile& file);

// The tokenizer metadata for a tokenizer.json: the tokenizer.ggml.* keys
// (ids up to vocab_size; ids the tokenizer lacks become unused "[PAD<id>]"
// entries as llama.cpp writes them) and affinity.tokenizer.json. bos/eos ids
// are not included: config_gguf_metadata writes them. `source` labels errors.
Result<GgufMetadata> tokenizer_gguf_metadata(std::string_view tokenizer_json, const std::string& source,
                                             int64_t vocab_size);

}  // namespace aff::dsv4
