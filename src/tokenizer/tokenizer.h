// Byte-level BPE tokenizer read from an HF tokenizer.json (DeepSeek-V4 shape:
// three ordered Split pre-tokenizer regexes, ByteLevel, added/special tokens).
// Contract fixed here; implementation in src/tokenizer/.
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
  virtual ~Tokenizer() = default;

  // parse_special: recognise added/special token strings in `text` (as HF
  // tokenizers does); false tokenises them as plain text.
  virtual std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const = 0;
  // Bytes of one token (byte-level decoded; may be a partial UTF-8 sequence).
  virtual std::string token_bytes(int32_t id) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const = 0;
  virtual int32_t token_id(std::string_view token) const = 0;  // -1 if unknown
  virtual bool is_special(int32_t id) const = 0;
  virtual int32_t vocab_size() const = 0;                     // max id + 1
};

// Streams decoded text: holds back an incomplete UTF-8 tail until it completes.
class StreamingDecoder {
 public:
  explicit StreamingDecoder(const Tokenizer& tok) : tok_(tok) {}
  std::string push(int32_t id);  // text that became complete with this token
  std::string flush();           // whatever is left (invalid bytes replaced by U+FFFD)
 private:
  const Tokenizer& tok_;
  std::string pending_;
};

}  // namespace aff
