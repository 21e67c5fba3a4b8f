#include "tokenizer/byte_level.h"

#include "tokenizer/utf8.h"

namespace aff::tokenizer {
namespace {

struct ByteMap {
  std::array<char32_t, 256> to_cp{};
  std::array<std::string, 256> to_utf8;
  std::array<uint8_t, 68> from_shifted{};  // byte for code point 0x100 + k
  ByteMap() {
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      if (!printable) from_shifted[next - 256] = uint8_t(b);
      to_cp[b] = printable ? char32_t(b) : next++;
      utf8_append(to_utf8[b], to_cp[b]);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

}  // namespace

char32_t byte_to_unicode(uint8_t b) { return byte_map().to_cp[b]; }

const std::string& byte_to_unicode_utf8(uint8_t b) { return byte_map().to_utf8[b]; }

int byte_from_unicode(char32_t cp) {
  // The image is [0x21, 0x7E] ∪ [0xA1, 0xAC] ∪ [0xAE, 0xFF] (identity) plus
  // [0x100, 0x143] for the remaining bytes in order.
  if ((cp >= '!' && cp <= '~') || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF)) {
    return int(cp);
  }
  if (cp >= 0x100 && cp < 0x100 + 68) return byte_map().from_shifted[cp - 0x100];
  return -1;
}

std::string byte_level_decode(std::string_view token) {
  std::string out;
  out.reserve(token.size());
  size_t i = 0;
  while (i < token.size()) {
    size_t len = 0;
    const int b = byte_from_unicode(utf8_decode_at(token, i, &len));
    if (b < 0) return std::string(token);
    out.push_back(char(b));
    i += len;
  }
  return out;
}

}  // namespace aff::tokenizer
