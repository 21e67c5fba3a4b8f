// Byte-level BPE tokenizer read from an HF tokenizer.json (DeepSeek-V4 shape:
// three ordered Split pre-tokenizer regexes, ByteLevel, added/special tokens).
// Contract fixed here; implementation in src/tokenizer/ (bpe_tokenizer.cpp).
//
// Semantics follow HF `tokenizers` (Tokenizer.encode(text, add_special_tokens=False)
// and Tokenizer.decode), which the tests check id for id:
//  - added tokens (special or not) are cut out of the text first, leftmost-longest,
//    non-normalized ones in a first pass and normalized ones in the gaps, honouring
//    lstrip / rstrip / single_word; the gaps are pre-tokenized and BPE-encoded;
//  - encode never adds BOS/EOS (the chat renderer writes them as text);
//  - text that is not valid UTF-8 is encoded as if each invalid sequence were U+FFFD.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "affinity/status.h"

namespace aff {

class Tokenizer {
 public:
  static Result<std::unique_ptr<Tokenizer>> load(const std::string& tokenizer_json_path);
  // Same, from the JSON text itself; `source_name` only labels error messages.
  static Result<std::unique_ptr<Tokenizer>> load_from_json(std::string_view json_text,
                                                           const std::string& source_name);
  virtual ~Tokenizer() = default;

  // parse_special: recognise added/special token strings in `text` (as HF
  // tokenizers does); false tokenises them as plain text (no added token at all
  // is matched, so user text cannot inject control tokens).
  virtual std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const = 0;
  // Bytes of one token (byte-level decoded; may be a partial UTF-8 sequence).
  // Unknown ids give "".
  virtual std::string token_bytes(int32_t id) const = 0;
  // Concatenated token bytes, invalid UTF-8 replaced by U+FFFD (one per maximal
  // invalid subpart, as Rust's from_utf8_lossy). skip_special drops tokens whose
  // added-token entry has special=true; unknown ids are dropped.
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const = 0;
  virtual int32_t token_id(std::string_view token) const = 0;  // -1 if unknown
  virtual bool is_special(int32_t id) const = 0;
  virtual int32_t vocab_size() const = 0;                     // max id + 1
};

// Streams decoded text: holds back an incomplete UTF-8 tail until it completes.
// The concatenation of every push() and the final flush() equals
// tok.decode(all ids, skip_special).
class StreamingDecoder {
 public:
  explicit StreamingDecoder(const Tokenizer& tok, bool skip_special = false)
      : tok_(tok), skip_special_(skip_special) {}
  std::string push(int32_t id);  // text that became complete with this token
  std::string flush();           // whatever is left (invalid bytes replaced by U+FFFD)
 private:
  const Tokenizer& tok_;
  bool skip_special_ = false;
  std::string pending_;
};

}  // namespace aff
