// The GPT-2 byte <-> unicode map that HF's ByteLevel pre-tokenizer/decoder use:
// every byte becomes one printable code point, so a byte string can be a BPE
// "word". Printable Latin-1 bytes map to themselves; the other 68 bytes map, in
// byte order, to U+0100, U+0101, ...
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace aff::tokenizer {

// Code point that stands for byte b.
char32_t byte_to_unicode(uint8_t b);

// UTF-8 spelling of byte_to_unicode(b), for building vocab keys.
const std::string& byte_to_unicode_utf8(uint8_t b);

// Byte for code point cp, or -1 when cp is not in the map.
int byte_from_unicode(char32_t cp);

// Inverse of ByteLevel for one token string (valid UTF-8): the bytes each code
// point stands for. When some code point is not in the map (added tokens such as
// "<｜User｜>"), HF's decoder keeps the token's own UTF-8 bytes, and so do we.
std::string byte_level_decode(std::string_view token);

}  // namespace aff::tokenizer
