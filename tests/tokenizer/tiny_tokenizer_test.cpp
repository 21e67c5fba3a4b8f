// The tiny tokenizer trained in V4's shape (tools/tokenizer/make_tiny_tokenizer.py)
// against HF tokenizers. Its added tokens carry the lstrip / rstrip /
// single_word / normalized flags that V4's own file does not exercise, and its
// merges use the [["a", "b"]] encoding where V4's use "a b" strings.
#include <algorithm>

#include "tokenizer_fixtures.h"

namespace aff::tokenizer_test {
namespace {

TEST(TinyTokenizer, CorpusIdsMatchHf) {
  const Tokenizer& tok = tiny_tokenizer();
  EXPECT_EQ(tok.vocab_size(), expected("tiny_expected.json").at("vocab_size").get<int>());
  for (const auto& c : expected("tiny_expected.json").at("cases")) {
    const std::string text = c.at("text");
    EXPECT_EQ(tok.encode(text, true), ids_of(c.at("ids"))) << "text: " << show(text);
    EXPECT_EQ(tok.encode(text, false), ids_of(c.at("ids_plain"))) << "text: " << show(text);
  }
}

TEST(TinyTokenizer, DecodeMatchesHf) {
  const Tokenizer& tok = tiny_tokenizer();
  for (const auto& c : expected("tiny_expected.json").at("cases")) {
    const std::vector<int32_t> ids = ids_of(c.at("ids"));
    EXPECT_EQ(tok.decode(ids, false), c.at("decoded").get<std::string>());
    EXPECT_EQ(tok.decode(ids, true), c.at("decoded_skip_special").get<std::string>());
  }
  for (const auto& c : expected("tiny_expected.json").at("decode_cases")) {
    const std::vector<int32_t> ids = ids_of(c.at("ids"));
    EXPECT_EQ(tok.decode(ids, false), c.at("text").get<std::string>());
    EXPECT_EQ(tok.decode(ids, true), c.at("text_skip_special").get<std::string>());
  }
}

TEST(TinyTokenizer, AddedTokenFlagsBehaveLikeHf) {
  const Tokenizer& tok = tiny_tokenizer();
  const int32_t lstrip = tok.token_id("<lstrip>");
  const int32_t rstrip = tok.token_id("<rstrip>");
  const int32_t mask = tok.token_id("mask");
  ASSERT_GE(lstrip, 0);
  ASSERT_GE(rstrip, 0);
  ASSERT_GE(mask, 0);
  // lstrip swallows the whitespace before the token (it never reaches BPE).
  EXPECT_EQ(tok.encode("a \t <lstrip>"), (std::vector<int32_t>{tok.encode("a")[0], lstrip}));
  // rstrip swallows the whitespace after it.
  EXPECT_EQ(tok.encode("<rstrip> \n b"), (std::vector<int32_t>{rstrip, tok.encode("b")[0]}));
  // single_word: only a whole word matches.
  const std::vector<int32_t> inside = tok.encode("masking");
  EXPECT_EQ(std::count(inside.begin(), inside.end(), mask), 0);
  const std::vector<int32_t> alone = tok.encode("a mask b");
  EXPECT_EQ(std::count(alone.begin(), alone.end(), mask), 1);
  // Decoding a stripped token gives its content only: the whitespace is gone.
  EXPECT_EQ(tok.decode(tok.encode("a \t <lstrip>")), "a<lstrip>");
}

TEST(TinyTokenizer, IgnoreMergesMatchesHf) {
  nlohmann::json spec = nlohmann::json::parse(tiny_tokenizer_json());
  spec["model"]["ignore_merges"] = true;
  auto r = Tokenizer::load_from_json(spec.dump(), "tiny_tokenizer.json+ignore_merges");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  const Tokenizer& tok = **r;
  for (const auto& c : expected("tiny_expected.json").at("cases")) {
    const std::string text = c.at("text");
    EXPECT_EQ(tok.encode(text, true), ids_of(c.at("ids_ignore_merges"))) << show(text);
  }
}

TEST(TinyTokenizer, MergesAsStringsEqualMergesAsPairs) {
  nlohmann::json spec = nlohmann::json::parse(tiny_tokenizer_json());
  ASSERT_TRUE(spec["model"]["merges"][0].is_array());
  nlohmann::json as_strings = nlohmann::json::array();
  for (const auto& m : spec["model"]["merges"]) {
    as_strings.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
  }
  spec["model"]["merges"] = as_strings;
  auto r = Tokenizer::load_from_json(spec.dump(), "tiny_tokenizer.json+string merges");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  for (const auto& c : expected("tiny_expected.json").at("cases")) {
    const std::string text = c.at("text");
    EXPECT_EQ((*r)->encode(text, true), ids_of(c.at("ids"))) << show(text);
  }
}

TEST(TinyTokenizer, RandomTextRoundTrips) {
  const Tokenizer& tok = tiny_tokenizer();
  std::mt19937 rng = fresh_rng();
  const std::vector<std::string> specials = {"<lstrip>", "<rstrip>", "<both>", "mask", "<raw>",
                                             "<long>", "<longer>", "<｜User｜>"};
  for (int i = 0; i < 300; ++i) {
    const std::string text = random_text(rng, 1 + int(rng() % 61), specials);
    // Stripping tokens drop whitespace, so only parse_special=false must round-trip.
    ASSERT_EQ(tok.decode(tok.encode(text, false)), text) << show(text);
    const std::vector<int32_t> ids = tok.encode(text, true);
    for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tok.vocab_size());
  }
}

}  // namespace
}  // namespace aff::tokenizer_test
