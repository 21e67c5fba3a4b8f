// Reading an HF tokenizer.json into the parts affinity's BPE tokenizer runs.
// Only the shape byte-level BPE models use is accepted (DeepSeek V3/V4, and
// tiny test tokenizers trained in that shape); anything else is reported as
// kUnsupported naming the field, never silently tokenised differently.
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "affinity/status.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe_model.h"

namespace aff::tokenizer {

// One Split pre-tokenizer step (behaviour Isolated, invert false).
struct SplitSpec {
  std::string pattern;
  bool literal = false;  // {"String": ...} rather than {"Regex": ...}
};

struct TokenizerSpec {
  std::vector<SplitSpec> splits;                     // applied in order
  std::unordered_map<std::string, int32_t> vocab;    // byte-level token string -> id
  std::vector<std::pair<std::string, std::string>> merges;  // best rank first
  BpeOptions bpe;
  std::vector<AddedToken> added;                     // file order
};

// `source` names the file in error messages.
Result<TokenizerSpec> parse_tokenizer_json(std::string_view json_text, const std::string& source);

}  // namespace aff::tokenizer
