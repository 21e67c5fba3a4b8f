// A compiled PCRE2 pattern (UTF + UCP, JIT when available) and the per-call
// scratch it matches with. Subjects must already be valid UTF-8: matching passes
// PCRE2_NO_UTF_CHECK, because re-validating on every call made long prompts
// quadratic.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "affinity/status.h"

namespace aff::tokenizer {

struct Span {
  size_t begin = 0;  // byte offset into the text being encoded
  size_t end = 0;    // exclusive
  size_t size() const { return end - begin; }
};

// Match data, JIT stack and match context for one thread's matching. Not
// thread-safe; one per encode() call.
class MatchScratch {
 public:
  MatchScratch();
  ~MatchScratch();
  MatchScratch(const MatchScratch&) = delete;
  MatchScratch& operator=(const MatchScratch&) = delete;

 private:
  friend class Pcre2Pattern;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class Pcre2Pattern {
 public:
  // literal: match `pattern` as a plain string (tokenizer.json {"String": ...}).
  // anchored: only match at the start offset. `where` names the pattern's
  // origin in error messages.
  static Result<Pcre2Pattern> compile(const std::string& pattern, bool literal, bool anchored,
                                      const std::string& where);
  Pcre2Pattern(Pcre2Pattern&&) noexcept;
  Pcre2Pattern& operator=(Pcre2Pattern&&) noexcept;
  ~Pcre2Pattern();

  // Searches subject[start, subject.size()) (the subject is the whole piece, so
  // lookbehind/lookahead stop at its ends). On a match sets [*mbegin, *mend)
  // relative to subject and returns true. A matching error other than "no
  // match" (resource limits) is reported as no match: the caller then keeps the
  // rest as one piece, which stays lossless.
  bool find(std::string_view subject, size_t start, MatchScratch& scratch, size_t* mbegin,
            size_t* mend) const;

  // Split with behaviour Isolated: appends the non-empty gaps and matches of
  // text[span] to `out`, in order.
  void split_isolated(std::string_view text, Span span, MatchScratch& scratch,
                      std::vector<Span>& out) const;

 private:
  Pcre2Pattern() = default;
  struct Code;
  std::unique_ptr<Code> code_;
};

}  // namespace aff::tokenizer
