#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace aff {

std::string StreamingDecoder::push(int32_t id) {
  if (skip_special_ && tok_.is_special(id)) return {};
  pending_ += tok_.token_bytes(id);
  // Everything but a valid-yet-unfinished last sequence can go out now; bytes
  // that can never become valid are replaced at once, exactly as decode() would.
  const size_t hold = tokenizer::utf8_incomplete_tail(pending_);
  const std::string_view ready = std::string_view(pending_).substr(0, pending_.size() - hold);
  std::string out = tokenizer::utf8_is_valid(ready) ? std::string(ready) : tokenizer::utf8_lossy(ready);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StreamingDecoder::flush() {
  std::string out = tokenizer::utf8_lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace aff
