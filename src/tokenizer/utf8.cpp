#include "tokenizer/utf8.h"

namespace aff::tokenizer {

Utf8Step utf8_step(std::string_view s, size_t i) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const size_t n = s.size();
  const uint8_t b0 = p[i];
  if (b0 < 0x80) return {Utf8StepKind::kValid, 1};
  // Allowed range of the second byte and total length, per the table of
  // well-formed byte sequences in the Unicode standard (ch. 3, table 3-7).
  uint8_t lo = 0x80, hi = 0xBF;
  size_t need;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // no UTF-16 surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return {Utf8StepKind::kInvalid, 1};
  }
  size_t k = 1;
  for (; k < need; ++k) {
    if (i + k >= n) return {Utf8StepKind::kTruncated, k};
    const uint8_t b = p[i + k];
    const uint8_t l = k == 1 ? lo : 0x80;
    const uint8_t h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) return {Utf8StepKind::kInvalid, k};
  }
  return {Utf8StepKind::kValid, need};
}

bool utf8_is_valid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    // ASCII fast path: prompts are mostly ASCII.
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const Utf8Step st = utf8_step(s, i);
    if (st.kind != Utf8StepKind::kValid) return false;
    i += st.len;
  }
  return true;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const Utf8Step st = utf8_step(s, i);
    if (st.kind == Utf8StepKind::kValid) {
      out.append(s.substr(i, st.len));
    } else {
      out.append(kReplacementChar);
    }
    i += st.len;
  }
  return out;
}

size_t utf8_incomplete_tail(std::string_view s) {
  // A sequence is at most 4 bytes, so only a start in the last 3 bytes can be cut off.
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const size_t i = n - back;
    const uint8_t b = static_cast<uint8_t>(s[i]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: keep looking for a lead
    const Utf8Step st = utf8_step(s, i);
    return st.kind == Utf8StepKind::kTruncated ? back : 0;
  }
  return 0;
}

char32_t utf8_decode_at(std::string_view s, size_t i, size_t* len) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data()) + i;
  if (p[0] < 0x80) {
    *len = 1;
    return p[0];
  }
  if (p[0] < 0xE0) {
    *len = 2;
    return char32_t(p[0] & 0x1F) << 6 | (p[1] & 0x3F);
  }
  if (p[0] < 0xF0) {
    *len = 3;
    return char32_t(p[0] & 0x0F) << 12 | char32_t(p[1] & 0x3F) << 6 | (p[2] & 0x3F);
  }
  *len = 4;
  return char32_t(p[0] & 0x07) << 18 | char32_t(p[1] & 0x3F) << 12 |
         char32_t(p[2] & 0x3F) << 6 | (p[3] & 0x3F);
}

size_t utf8_prev_start(std::string_view s, size_t end) {
  size_t i = end - 1;
  while (i > 0 && (static_cast<uint8_t>(s[i]) & 0xC0) == 0x80) --i;
  return i;
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

}  // namespace aff::tokenizer
