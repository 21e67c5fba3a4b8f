// UTF-8 helpers for the tokenizer: validation with "maximal subpart" error
// recovery (the rule Rust's String::from_utf8_lossy and Python's
// errors="replace" follow), so that our decode output matches HF byte for byte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace aff::tokenizer {

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

enum class Utf8StepKind {
  kValid,      // a complete, well-formed sequence of `len` bytes
  kInvalid,    // `len` bytes (the maximal subpart, >= 1) that can never be valid
  kTruncated,  // `len` bytes that are a valid prefix cut off by the end of input
};

struct Utf8Step {
  Utf8StepKind kind;
  size_t len;
};

// Classifies the sequence starting at s[i] (i < s.size()).
Utf8Step utf8_step(std::string_view s, size_t i);

// True when all of `s` is well-formed UTF-8.
bool utf8_is_valid(std::string_view s);

// `s` with every invalid or truncated subpart replaced by one U+FFFD.
std::string utf8_lossy(std::string_view s);

// Number of trailing bytes of `s` that form a valid but incomplete sequence
// (0..3): what a streaming decoder must hold back.
size_t utf8_incomplete_tail(std::string_view s);

// Decodes the code point at s[i]; `s` must be valid UTF-8 there. Sets *len.
char32_t utf8_decode_at(std::string_view s, size_t i, size_t* len);

// Start of the code point that ends at s[end] (exclusive end > 0); `s` valid.
size_t utf8_prev_start(std::string_view s, size_t end);

void utf8_append(std::string& out, char32_t cp);

}  // namespace aff::tokenizer
