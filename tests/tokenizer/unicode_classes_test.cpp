// Our PCRE2 classes, widened to HF's Unicode tables, against HF's own
// classification of every code point (tests/data/tokenizer/hf_unicode_classes.json,
// made by tools/tokenizer/make_unicode_tables.py).
#include "tokenizer/pcre2_pattern.h"
#include "tokenizer/unicode_classes.h"
#include "tokenizer/utf8.h"
#include "tokenizer_fixtures.h"

namespace aff::tokenizer {
namespace {

// Every scalar value once, in order, and the byte offset where each starts.
struct AllCodePoints {
  std::string text;
  std::vector<char32_t> cps;
  std::vector<size_t> offsets;
  AllCodePoints() {
    for (char32_t c = 0; c <= 0x10FFFF; ++c) {
      if (c >= 0xD800 && c <= 0xDFFF) continue;
      cps.push_back(c);
      offsets.push_back(text.size());
      utf8_append(text, c);
    }
  }
};

std::vector<bool> members_of(const std::string& pattern, const AllCodePoints& all) {
  auto compiled = Pcre2Pattern::compile(pattern, false, false, "test class");
  EXPECT_TRUE(compiled.is_ok()) << compiled.status().message();
  std::vector<bool> in(all.cps.size(), false);
  if (!compiled.is_ok()) return in;
  MatchScratch scratch;
  size_t pos = 0, b = 0, e = 0;
  size_t k = 0;  // index of the code point at byte offset `b`
  while (compiled->find(all.text, pos, scratch, &b, &e)) {
    while (all.offsets[k] < b) ++k;
    for (; k < all.offsets.size() && all.offsets[k] < e; ++k) in[k] = true;
    pos = e > b ? e : e + 1;
    if (pos > all.text.size()) break;
  }
  return in;
}

TEST(UnicodeClasses, WidenedClassesEqualHfOnEveryCodePoint) {
  const AllCodePoints all;
  const nlohmann::json hf =
      nlohmann::json::parse(aff::tokenizer_test::read_file(aff::tokenizer_test::data_path("hf_unicode_classes.json")));
  for (const char* name : {"L", "M", "N", "P", "S", "s"}) {
    const std::string pattern = widen_unicode_classes(
        std::string(name) == "s" ? std::string("\\s+") : std::string("\\p{") + name + "}+");
    const std::vector<bool> ours = members_of(pattern, all);
    std::vector<bool> theirs(all.cps.size(), false);
    for (const auto& r : hf.at(name)) {
      for (char32_t c = r[0].get<char32_t>(); c <= r[1].get<char32_t>(); ++c) {
        theirs[c < 0xD800 ? c : c - 0x800] = true;  // index skips the surrogates
      }
    }
    int mismatches = 0;
    for (size_t k = 0; k < all.cps.size(); ++k) {
      if (ours[k] != theirs[k] && ++mismatches <= 5) {
        ADD_FAILURE() << "class " << name << ": U+" << std::hex << uint32_t(all.cps[k])
                      << (theirs[k] ? " is a member for HF only" : " is a member for PCRE2 only");
      }
    }
    EXPECT_EQ(mismatches, 0) << "class " << name;
  }
}

TEST(UnicodeClasses, WideningKeepsPatternStructure) {
  EXPECT_EQ(widen_unicode_classes("abc"), "abc");
  EXPECT_EQ(widen_unicode_classes("\\p{Han}\\P{L}\\p{^L}"), "\\p{Han}\\P{L}\\p{^L}");
  const std::string outside = widen_unicode_classes("\\p{N}{1,3}");
  EXPECT_EQ(outside.rfind("[\\p{N}\\x{", 0), 0u) << outside;
  EXPECT_EQ(outside.substr(outside.size() - 6), "]{1,3}") << outside;
  // Inside a class the ranges join it; escaped brackets do not open or close one.
  const std::string inside = widen_unicode_classes("[^\\r\\n\\p{L}\\]]x\\[\\p{S}");
  EXPECT_EQ(inside.rfind("[^\\r\\n\\p{L}\\x{", 0), 0u) << inside;
  EXPECT_NE(inside.find("\\]]x\\[[\\p{S}\\x{"), std::string::npos) << inside;
  EXPECT_EQ(widen_unicode_classes("[]\\p{Lu}]"), "[]\\p{Lu}]");
  EXPECT_EQ(widen_unicode_classes("\\s+(?!\\S)"), "\\p{White_Space}+(?!\\P{White_Space})");
}

}  // namespace
}  // namespace aff::tokenizer
