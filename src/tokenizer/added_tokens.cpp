#include "tokenizer/added_tokens.h"

#include <algorithm>

#include "tokenizer/utf8.h"

namespace aff::tokenizer {

Result<AddedTokenMatcher> AddedTokenMatcher::build(const std::vector<const AddedToken*>& tokens) {
  AddedTokenMatcher m;
  m.trie_.emplace_back();
  m.first_byte_.assign(256, false);
  for (const AddedToken* t : tokens) {
    if (t->content.empty()) continue;
    int32_t node = 0;
    for (char c : t->content) {
      const uint8_t b = static_cast<uint8_t>(c);
      auto& kids = m.trie_[size_t(node)].children;
      auto it = std::lower_bound(kids.begin(), kids.end(), std::make_pair(b, int32_t(-1)));
      if (it != kids.end() && it->first == b) {
        node = it->second;
      } else {
        const int32_t child = int32_t(m.trie_.size());
        kids.insert(it, {b, child});
        m.trie_.emplace_back();
        node = child;
      }
    }
    // With equal contents the first one listed wins, like HF's trie.
    if (m.trie_[size_t(node)].token < 0) {
      m.trie_[size_t(node)].token = int32_t(m.tokens_.size());
      m.tokens_.push_back(*t);
      m.first_byte_[static_cast<uint8_t>(t->content[0])] = true;
    }
  }
  // Rust regex definitions: \w = [\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}],
  // \s = \p{White_Space}.
  AFF_ASSIGN_OR_RETURN(Pcre2Pattern word,
                       Pcre2Pattern::compile("[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}]",
                                             false, true, "added-token word class"));
  AFF_ASSIGN_OR_RETURN(Pcre2Pattern space, Pcre2Pattern::compile("\\p{White_Space}", false, true,
                                                                 "added-token space class"));
  m.classes_.push_back(std::move(word));
  m.classes_.push_back(std::move(space));
  return m;
}

int32_t AddedTokenMatcher::longest_at(std::string_view s, size_t pos) const {
  int32_t node = 0;
  int32_t best = -1;
  for (size_t i = pos; i < s.size(); ++i) {
    const uint8_t b = static_cast<uint8_t>(s[i]);
    const auto& kids = trie_[size_t(node)].children;
    auto it = std::lower_bound(kids.begin(), kids.end(), std::make_pair(b, int32_t(-1)));
    if (it == kids.end() || it->first != b) break;
    node = it->second;
    if (trie_[size_t(node)].token >= 0) best = trie_[size_t(node)].token;
  }
  return best;
}

bool AddedTokenMatcher::is_word_char_at(std::string_view s, size_t pos,
                                        MatchScratch& scratch) const {
  size_t b = 0, e = 0;
  return classes_[0].find(s, pos, scratch, &b, &e);
}

bool AddedTokenMatcher::is_space_at(std::string_view s, size_t pos, MatchScratch& scratch) const {
  size_t b = 0, e = 0;
  return classes_[1].find(s, pos, scratch, &b, &e);
}

void AddedTokenMatcher::split(std::string_view text, Span span, MatchScratch& scratch,
                              std::vector<Segment>& out) const {
  const std::string_view s = text.substr(span.begin, span.size());
  size_t start_offset = 0;  // end of the last emitted segment
  size_t pos = 0;           // where the next search starts
  while (pos < s.size()) {
    // Leftmost start, then longest content at that start.
    int32_t hit = -1;
    for (; pos < s.size(); ++pos) {
      if (!first_byte_[static_cast<uint8_t>(s[pos])]) continue;
      hit = longest_at(s, pos);
      if (hit >= 0) break;
    }
    if (hit < 0) break;
    const AddedToken& tok = tokens_[size_t(hit)];
    size_t start = pos;
    size_t stop = pos + tok.content.size();
    // The search resumes after the raw match even when the match is discarded
    // or widened below (HF's non-overlapping iterator does the same).
    pos = stop;
    if (tok.single_word) {
      const bool word_before = start > 0 && is_word_char_at(s, utf8_prev_start(s, start), scratch);
      const bool word_after = stop < s.size() && is_word_char_at(s, stop, scratch);
      if (word_before || word_after) continue;
    }
    if (tok.lstrip) {
      size_t new_start = start;
      while (new_start > 0) {
        const size_t prev = utf8_prev_start(s, new_start);
        if (!is_space_at(s, prev, scratch)) break;
        new_start = prev;
      }
      // Whitespace an earlier match already took stays with it.
      start = std::max(new_start, start_offset);
    }
    if (tok.rstrip) {
      while (stop < s.size() && is_space_at(s, stop, scratch)) {
        size_t len = 0;
        utf8_decode_at(s, stop, &len);
        stop += len;
      }
    }
    if (start_offset < start) out.push_back({{span.begin + start_offset, span.begin + start}, -1});
    out.push_back({{span.begin + start, span.begin + stop}, tok.id});
    start_offset = stop;
  }
  if (start_offset < s.size()) out.push_back({{span.begin + start_offset, span.end}, -1});
}

}  // namespace aff::tokenizer
