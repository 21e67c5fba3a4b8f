// Added tokens (tokenizer.json "added_tokens"): strings cut out of the input
// whole, before pre-tokenization and BPE. Matching mirrors HF tokenizers'
// AddedVocabulary: leftmost-longest over all contents of one pass, then the
// single_word / lstrip / rstrip rules on each match.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "affinity/status.h"
#include "tokenizer/pcre2_pattern.h"

namespace aff::tokenizer {

struct AddedToken {
  std::string content;       // exact UTF-8 text matched
  int32_t id = -1;
  bool special = false;      // dropped by decode(skip_special)
  bool lstrip = false;       // swallow whitespace on the left
  bool rstrip = false;       // swallow whitespace on the right
  bool single_word = false;  // only match when not inside a word
  bool normalized = true;    // matched in the second pass (after normalisation)
};

// A run of the input: an added token (added_id >= 0) or plain text (-1).
struct Segment {
  Span span;
  int32_t added_id = -1;
};

class AddedTokenMatcher {
 public:
  // `tokens`: the contents this pass matches, in HF's order (special tokens
  // first, then the others, each in file order); empty contents are skipped.
  static Result<AddedTokenMatcher> build(const std::vector<const AddedToken*>& tokens);
  AddedTokenMatcher(AddedTokenMatcher&&) noexcept = default;
  AddedTokenMatcher& operator=(AddedTokenMatcher&&) noexcept = default;

  bool empty() const { return tokens_.empty(); }

  // Appends the segments of text[span] to out, covering it in order. As in HF,
  // the span is treated as a whole sentence: "start of word" and whitespace
  // stripping look no further than its ends. Plain-text segments are non-empty.
  void split(std::string_view text, Span span, MatchScratch& scratch,
             std::vector<Segment>& out) const;

 private:
  AddedTokenMatcher() = default;
  // Longest token starting at s[pos]: index into tokens_, or -1.
  int32_t longest_at(std::string_view s, size_t pos) const;
  bool is_word_char_at(std::string_view s, size_t pos, MatchScratch& scratch) const;
  bool is_space_at(std::string_view s, size_t pos, MatchScratch& scratch) const;

  // Byte trie over the token contents; node 0 is the root.
  struct TrieNode {
    std::vector<std::pair<uint8_t, int32_t>> children;  // (byte, node), sorted by byte
    int32_t token = -1;                                 // index into tokens_ ending here
  };
  std::vector<TrieNode> trie_;
  std::vector<bool> first_byte_;  // [256]: some content starts with this byte
  std::vector<AddedToken> tokens_;  // this pass's tokens, trie order
  // Rust regex's \w and \s (HF uses them for single_word / lstrip / rstrip).
  // PCRE2's Unicode 14 tables: a letter newer than that next to a single_word
  // token counts as a word character for HF but not here (V4 has no such token).
  std::vector<Pcre2Pattern> classes_;  // [0] = word char, [1] = white space
};

}  // namespace aff::tokenizer
