#include "tokenizer/bpe_tokenizer.h"

#include <fstream>
#include <sstream>
#include <unordered_set>

#include "tokenizer/byte_level.h"
#include "tokenizer/unicode_classes.h"
#include "tokenizer/utf8.h"

namespace aff {

Result<std::unique_ptr<Tokenizer>> Tokenizer::load_from_json(std::string_view json_text,
                                                             const std::string& source_name) {
  AFF_ASSIGN_OR_RETURN(tokenizer::TokenizerSpec spec,
                       tokenizer::parse_tokenizer_json(json_text, source_name));
  AFF_ASSIGN_OR_RETURN(std::unique_ptr<tokenizer::BpeTokenizer> tok,
                       tokenizer::BpeTokenizer::create(std::move(spec), source_name));
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::load(const std::string& tokenizer_json_path) {
  std::ifstream in(tokenizer_json_path, std::ios::binary);
  if (!in) return not_found(tokenizer_json_path + ": cannot open tokenizer file");
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) return io_error(tokenizer_json_path + ": read failed");
  return load_from_json(buf.str(), tokenizer_json_path);
}

}  // namespace aff

namespace aff::tokenizer {

Result<std::unique_ptr<BpeTokenizer>> BpeTokenizer::create(TokenizerSpec spec,
                                                           const std::string& source) {
  std::vector<Pcre2Pattern> splits;
  for (size_t i = 0; i < spec.splits.size(); ++i) {
    const SplitSpec& split = spec.splits[i];
    // Regexes get HF's (newer) Unicode tables for \p{L} and friends.
    const std::string pattern = split.literal ? split.pattern : widen_unicode_classes(split.pattern);
    AFF_ASSIGN_OR_RETURN(Pcre2Pattern p,
                         Pcre2Pattern::compile(pattern, split.literal, false,
                                               source + ": pre_tokenizer Split #" + std::to_string(i)));
    splits.push_back(std::move(p));
  }

  // Check added-token ids the way HF assigns them on load (an entry already in
  // the vocab keeps its vocab id; a new one gets the next id after the vocab),
  // so a file HF would renumber is rejected instead of silently disagreeing.
  const int64_t vocab_count = int64_t(spec.vocab.size());
  int64_t max_added = -1;
  std::unordered_set<std::string> seen;
  for (const AddedToken& a : spec.added) {
    const std::string where = source + ": added token \"" + a.content + "\" (id " +
                              std::to_string(a.id) + ")";
    if (a.content.empty()) return corrupt(where + " has empty content");
    if (!utf8_is_valid(a.content)) return corrupt(where + " is not valid UTF-8");
    if (!seen.insert(a.content).second) return corrupt(where + " is listed twice");
    auto in_vocab = spec.vocab.find(a.content);
    int64_t expected;
    if (in_vocab != spec.vocab.end()) {
      expected = in_vocab->second;
    } else {
      expected = (max_added >= vocab_count || vocab_count == 0) ? max_added + 1 : vocab_count;
    }
    if (a.id != expected) {
      return corrupt(where + ": HF tokenizers would give it id " + std::to_string(expected));
    }
    max_added = std::max(max_added, int64_t(a.id));
  }

  AFF_ASSIGN_OR_RETURN(BpeModel model,
                       BpeModel::build(std::move(spec.vocab), spec.merges, spec.bpe, source));

  std::vector<AddedToken> added = std::move(spec.added);
  // HF's matching order: special tokens first, then the rest, each in file order.
  std::vector<const AddedToken*> raw, normalized;
  for (int pass = 0; pass < 2; ++pass) {
    for (const AddedToken& a : added) {
      if (a.special != (pass == 0)) continue;
      (a.normalized ? normalized : raw).push_back(&a);
    }
  }
  AFF_ASSIGN_OR_RETURN(AddedTokenMatcher raw_pass, AddedTokenMatcher::build(raw));
  AFF_ASSIGN_OR_RETURN(AddedTokenMatcher normalized_pass, AddedTokenMatcher::build(normalized));
  return std::unique_ptr<BpeTokenizer>(new BpeTokenizer(
      std::move(model), std::move(splits), std::move(added), std::move(raw_pass),
      std::move(normalized_pass)));
}

BpeTokenizer::BpeTokenizer(BpeModel model, std::vector<Pcre2Pattern> splits,
                           std::vector<AddedToken> added, AddedTokenMatcher raw_pass,
                           AddedTokenMatcher normalized_pass)
    : model_(std::move(model)),
      splits_(std::move(splits)),
      added_(std::move(added)),
      raw_pass_(std::move(raw_pass)),
      normalized_pass_(std::move(normalized_pass)) {
  int32_t size = 0;
  for (const auto& [tok, id] : model_.vocab()) size = std::max(size, id + 1);
  for (const AddedToken& a : added_) size = std::max(size, a.id + 1);
  id_bytes_.assign(size_t(size), std::string());
  id_known_.assign(size_t(size), 0);
  id_special_.assign(size_t(size), 0);
  for (const auto& [tok, id] : model_.vocab()) {
    id_bytes_[size_t(id)] = byte_level_decode(tok);
    id_known_[size_t(id)] = 1;
  }
  for (const AddedToken& a : added_) {
    // An added token's own content wins over a vocab entry with the same id.
    id_bytes_[size_t(a.id)] = byte_level_decode(a.content);
    id_known_[size_t(a.id)] = 1;
    added_ids_.emplace(a.content, a.id);
    // HF decides "special" by the token's string; create() made sure an added
    // token found in the vocab has the vocab id, so per-id is the same thing.
    id_special_[size_t(a.id)] = a.special ? 1 : 0;
  }
}

void BpeTokenizer::encode_plain(std::string_view text, Span span, MatchScratch& scratch,
                                std::vector<int32_t>& out) const {
  thread_local std::vector<Span> cur, next;
  cur.assign(1, span);
  for (const Pcre2Pattern& split : splits_) {
    next.clear();
    for (const Span& s : cur) split.split_isolated(text, s, scratch, next);
    cur.swap(next);
  }
  for (const Span& piece : cur) model_.encode_piece(text.substr(piece.begin, piece.size()), out);
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view input, bool parse_special) const {
  std::string repaired;
  std::string_view text = input;
  if (!utf8_is_valid(input)) {
    repaired = utf8_lossy(input);
    text = repaired;
  }
  std::vector<int32_t> ids;
  if (text.empty()) return ids;
  ids.reserve(text.size() / 3 + 16);
  MatchScratch scratch;
  const Span all{0, text.size()};
  if (!parse_special || (raw_pass_.empty() && normalized_pass_.empty())) {
    encode_plain(text, all, scratch, ids);
    return ids;
  }
  std::vector<Segment> first, second;
  raw_pass_.split(text, all, scratch, first);
  for (const Segment& seg : first) {
    if (seg.added_id >= 0) {
      second.push_back(seg);
    } else {
      normalized_pass_.split(text, seg.span, scratch, second);
    }
  }
  for (const Segment& seg : second) {
    if (seg.added_id >= 0) {
      ids.push_back(seg.added_id);
    } else {
      encode_plain(text, seg.span, scratch, ids);
    }
  }
  return ids;
}

std::string BpeTokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return id_bytes_[size_t(id)];
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size() || !id_known_[size_t(id)]) continue;
    if (skip_special && id_special_[size_t(id)]) continue;
    bytes += id_bytes_[size_t(id)];
  }
  return utf8_is_valid(bytes) ? bytes : utf8_lossy(bytes);
}

int32_t BpeTokenizer::token_id(std::string_view token) const {
  auto it = added_ids_.find(std::string(token));
  if (it != added_ids_.end()) return it->second;
  return model_.token_id(token);
}

bool BpeTokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && id_special_[size_t(id)];
}

}  // namespace aff::tokenizer
