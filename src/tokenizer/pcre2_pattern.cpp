#include "tokenizer/pcre2_pattern.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer/utf8.h"

namespace aff::tokenizer {

namespace {
// Long runs of one class (e.g. a megabyte of spaces) need more JIT stack than
// PCRE2's 32 KiB default; the stack grows on demand up to the maximum.
constexpr size_t kJitStackStart = 32 * 1024;
constexpr size_t kJitStackMax = 8 * 1024 * 1024;
}  // namespace

struct MatchScratch::Impl {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  ~Impl() {
    if (data) pcre2_match_data_free(data);
    if (context) pcre2_match_context_free(context);
    if (jit_stack) pcre2_jit_stack_free(jit_stack);
  }
};

MatchScratch::MatchScratch() : impl_(std::make_unique<Impl>()) {
  // One ovector pair is enough: only the whole-match span is used.
  impl_->data = pcre2_match_data_create(1, nullptr);
  impl_->context = pcre2_match_context_create(nullptr);
  impl_->jit_stack = pcre2_jit_stack_create(kJitStackStart, kJitStackMax, nullptr);
  if (impl_->context && impl_->jit_stack) {
    pcre2_jit_stack_assign(impl_->context, nullptr, impl_->jit_stack);
  }
}

MatchScratch::~MatchScratch() = default;

struct Pcre2Pattern::Code {
  pcre2_code* code = nullptr;
  ~Code() {
    if (code) pcre2_code_free(code);
  }
};

Pcre2Pattern::Pcre2Pattern(Pcre2Pattern&&) noexcept = default;
Pcre2Pattern& Pcre2Pattern::operator=(Pcre2Pattern&&) noexcept = default;
Pcre2Pattern::~Pcre2Pattern() = default;

Result<Pcre2Pattern> Pcre2Pattern::compile(const std::string& pattern, bool literal,
                                           bool anchored, const std::string& where) {
  if (!utf8_is_valid(pattern)) return corrupt(where + ": pattern is not valid UTF-8");
  uint32_t options = PCRE2_UTF | PCRE2_UCP;
  if (literal) options |= PCRE2_LITERAL;
  if (anchored) options |= PCRE2_ANCHORED;
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   options, &error, &error_offset, nullptr);
  if (!code) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(error, buf, sizeof(buf));
    return unsupported(where + ": PCRE2 cannot compile the pattern at offset " +
                       std::to_string(error_offset) + ": " + reinterpret_cast<char*>(buf));
  }
  // JIT failing (e.g. an unsupported CPU) is not an error: the interpreter
  // gives the same matches, only slower.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  Pcre2Pattern p;
  p.code_ = std::make_unique<Code>();
  p.code_->code = code;
  return p;
}

bool Pcre2Pattern::find(std::string_view subject, size_t start, MatchScratch& scratch,
                        size_t* mbegin, size_t* mend) const {
  MatchScratch::Impl& s = *scratch.impl_;
  const int rc = pcre2_match(code_->code, reinterpret_cast<PCRE2_SPTR>(subject.data()),
                             subject.size(), start, PCRE2_NO_UTF_CHECK, s.data, s.context);
  if (rc < 0) return false;
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s.data);
  *mbegin = ov[0];
  *mend = ov[1];
  return true;
}

void Pcre2Pattern::split_isolated(std::string_view text, Span span, MatchScratch& scratch,
                                  std::vector<Span>& out) const {
  const std::string_view piece = text.substr(span.begin, span.size());
  size_t prev = 0;   // end of the last cut
  size_t start = 0;  // where the next search starts
  size_t mb = 0, me = 0;
  while (start <= piece.size() && find(piece, start, scratch, &mb, &me)) {
    if (mb > prev) out.push_back({span.begin + prev, span.begin + mb});
    if (me > mb) out.push_back({span.begin + mb, span.begin + me});
    prev = me;
    if (me > mb) {
      start = me;
    } else {
      // An empty match still cuts the text; step over one code point so the
      // search makes progress (what Oniguruma's iterator does).
      if (me >= piece.size()) break;
      size_t len = 0;
      utf8_decode_at(piece, me, &len);
      start = me + len;
    }
  }
  if (prev < piece.size()) out.push_back({span.begin + prev, span.end});
}

}  // namespace aff::tokenizer
