// aff::Tokenizer for byte-level BPE tokenizer.json files: added-token split,
// ordered Split regexes, ByteLevel, BPE. See tokenizer.h for the semantics.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/pcre2_pattern.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_json.h"

namespace aff::tokenizer {

class BpeTokenizer final : public Tokenizer {
 public:
  static Result<std::unique_ptr<BpeTokenizer>> create(TokenizerSpec spec, const std::string& source);

  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const override;
  std::string token_bytes(int32_t id) const override;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const override;
  int32_t token_id(std::string_view token) const override;
  bool is_special(int32_t id) const override;
  int32_t vocab_size() const override { return int32_t(id_bytes_.size()); }

 private:
  BpeTokenizer(BpeModel model, std::vector<Pcre2Pattern> splits, std::vector<AddedToken> added,
               AddedTokenMatcher raw_pass, AddedTokenMatcher normalized_pass);
  // Pre-tokenizes text[span] (plain text, no added tokens) and BPE-encodes each piece.
  void encode_plain(std::string_view text, Span span, MatchScratch& scratch,
                    std::vector<int32_t>& out) const;

  BpeModel model_;
  std::vector<Pcre2Pattern> splits_;  // Split pre-tokenizers, applied in order
  std::vector<AddedToken> added_;     // file order
  // HF matches added tokens in two passes: normalized=false ones on the raw
  // text, then normalized=true ones inside the remaining gaps.
  AddedTokenMatcher raw_pass_;
  AddedTokenMatcher normalized_pass_;
  std::unordered_map<std::string, int32_t> added_ids_;  // content -> id
  std::vector<std::string> id_bytes_;  // [vocab_size]: decoded bytes per id ("" if unused)
  std::vector<uint8_t> id_known_;      // [vocab_size]: 1 if the id names a token
  std::vector<uint8_t> id_special_;    // [vocab_size]: 1 if skip_special drops it
};

}  // namespace aff::tokenizer
