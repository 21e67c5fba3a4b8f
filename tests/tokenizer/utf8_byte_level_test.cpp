// UTF-8 repair/tail rules and the GPT-2 byte map, checked against the Unicode
// standard's worked example and against brute-force properties.
#include <algorithm>
#include <set>

#include "tokenizer/byte_level.h"
#include "tokenizer/utf8.h"
#include "tokenizer_fixtures.h"

namespace aff::tokenizer {
namespace {

const std::string kFffd(kReplacementChar);

TEST(Utf8, LossyReplacesMaximalSubparts) {
  // Unicode standard, ch. 3 "U+FFFD substitution of maximal subparts" example.
  EXPECT_EQ(utf8_lossy("\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64"),
            "a" + kFffd + kFffd + kFffd + "b" + kFffd + "c" + kFffd + kFffd + "d");
  EXPECT_EQ(utf8_lossy("\xED\xA0\x80"), kFffd + kFffd + kFffd);  // surrogate: 3 subparts
  EXPECT_EQ(utf8_lossy("\xF4\x90\x80\x80"), kFffd + kFffd + kFffd + kFffd);  // > U+10FFFF
  EXPECT_EQ(utf8_lossy("\xC0\xAF"), kFffd + kFffd);                          // overlong
  EXPECT_EQ(utf8_lossy("\xE2\x82"), kFffd);                                  // truncated
  EXPECT_EQ(utf8_lossy("h\xC3\xA9llo"), "h\xC3\xA9llo");
}

TEST(Utf8, RandomBytesBecomeValidAndValidTextIsKept) {
  std::mt19937 rng = aff::tokenizer_test::fresh_rng();
  for (int trial = 0; trial < 2000; ++trial) {
    std::string bytes(1 + rng() % 23, '\0');
    for (char& c : bytes) c = char(rng() % 4 == 0 ? rng() % 128 : 0x80 + rng() % 128);
    const std::string fixed = utf8_lossy(bytes);
    ASSERT_TRUE(utf8_is_valid(fixed));
    ASSERT_EQ(utf8_is_valid(bytes), fixed == bytes);
    // Repair is idempotent and local: repairing a repaired string changes nothing.
    ASSERT_EQ(utf8_lossy(fixed), fixed);
  }
}

TEST(Utf8, IncompleteTailIsTheCutCharacter) {
  std::mt19937 rng = aff::tokenizer_test::fresh_rng();
  for (int trial = 0; trial < 200; ++trial) {
    std::string text;
    std::vector<size_t> starts;  // byte offset of each code point
    for (int i = 0; i < 13; ++i) {
      starts.push_back(text.size());
      static const char32_t kCps[] = {U'a', U'\u00e9', U'\u4f60', U'\U0001F600', U'\u0800',
                                      U'\U0010FFFF', U'\uFFFD'};
      utf8_append(text, kCps[rng() % 7]);
    }
    ASSERT_TRUE(utf8_is_valid(text));
    for (size_t cut = 0; cut <= text.size(); ++cut) {
      size_t start = 0;
      for (size_t s : starts) if (s <= cut) start = s;
      const size_t expect = (cut == text.size() || std::count(starts.begin(), starts.end(), cut))
                                ? 0 : cut - start;
      ASSERT_EQ(utf8_incomplete_tail(std::string_view(text).substr(0, cut)), expect)
          << "cut " << cut;
    }
  }
}

TEST(ByteLevel, MapIsABijectionOntoPrintableCodePoints) {
  std::set<char32_t> seen;
  for (int b = 0; b < 256; ++b) {
    const char32_t cp = byte_to_unicode(uint8_t(b));
    EXPECT_TRUE(seen.insert(cp).second) << b;
    EXPECT_EQ(byte_from_unicode(cp), b);
    EXPECT_GT(cp, U' ');           // never a control or space character
    EXPECT_NE(cp, char32_t(0x7F));
    EXPECT_NE(cp, char32_t(0xAD));  // soft hyphen is invisible
  }
  EXPECT_EQ(byte_to_unicode(' '), char32_t(0x120));  // "Ġ"
  EXPECT_EQ(byte_to_unicode('\n'), char32_t(0x10A));  // "Ċ"
  EXPECT_EQ(byte_to_unicode('A'), U'A');
  EXPECT_EQ(byte_from_unicode(U'\u4f60'), -1);
}

TEST(ByteLevel, DecodeInvertsTheMapAndKeepsForeignTokens) {
  std::mt19937 rng = aff::tokenizer_test::fresh_rng();
  for (int trial = 0; trial < 100; ++trial) {
    std::string bytes(1 + rng() % 31, '\0');
    for (char& c : bytes) c = char(rng() % 256);
    std::string spelled;
    for (char c : bytes) spelled += byte_to_unicode_utf8(uint8_t(c));
    ASSERT_EQ(byte_level_decode(spelled), bytes);
  }
  // A code point outside the map (as in "<｜User｜>") keeps the token's own bytes.
  EXPECT_EQ(byte_level_decode("<｜User｜>"), "<｜User｜>");
  EXPECT_EQ(byte_level_decode("ĠHello"), " Hello");
}

}  // namespace
}  // namespace aff::tokenizer
