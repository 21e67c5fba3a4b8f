// The real DeepSeek-V4 tokenizer against HF tokenizers' ids and decodes
// (tests/data/tokenizer/v4_expected.json, made by tools/tokenizer/make_expected.py).
#include <chrono>
#include <thread>

#include "tokenizer/utf8.h"
#include "tokenizer_fixtures.h"

namespace aff::tokenizer_test {
namespace {

void check_special_token_ids_are_v4s() {
  const Tokenizer& tok = v4_tokenizer();
  EXPECT_EQ(tok.vocab_size(), 129280);
  EXPECT_EQ(tok.vocab_size(), expected("v4_expected.json").at("vocab_size").get<int>());
  EXPECT_EQ(tok.token_id("<｜begin▁of▁sentence｜>"), 0);
  EXPECT_EQ(tok.token_id("<｜end▁of▁sentence｜>"), 1);
  EXPECT_EQ(tok.token_id("<｜User｜>"), 128803);
  EXPECT_EQ(tok.token_id("<｜Assistant｜>"), 128804);
  EXPECT_EQ(tok.token_id("<think>"), 128821);
  EXPECT_EQ(tok.token_id("</think>"), 128822);
  EXPECT_EQ(tok.token_id("｜DSML｜"), 128825);
  EXPECT_EQ(tok.token_id("<｜latest_reminder｜>"), 128828);
  EXPECT_EQ(tok.token_id("no such token"), -1);
  EXPECT_EQ(tok.token_id("Hello"), 19923);  // a plain vocab entry (byte-level spelling)
  EXPECT_TRUE(tok.is_special(0));
  EXPECT_TRUE(tok.is_special(1));
  // Role and thinking tokens are added but not special in V4's file.
  EXPECT_FALSE(tok.is_special(128803));
  EXPECT_FALSE(tok.is_special(128821));
  EXPECT_FALSE(tok.is_special(19923));
  EXPECT_FALSE(tok.is_special(-5));
  EXPECT_EQ(tok.token_bytes(128821), "<think>");
  EXPECT_EQ(tok.token_bytes(223), " ");  // "Ġ" is the byte-level spelling of a space
  EXPECT_EQ(tok.token_bytes(999999), "");
}

void check_corpus_ids_match_hf() {
  const Tokenizer& tok = v4_tokenizer();
  int n = 0;
  for (const auto& c : expected("v4_expected.json").at("cases")) {
    const std::string text = c.at("text");
    EXPECT_EQ(tok.encode(text, true), ids_of(c.at("ids"))) << "text: " << show(text);
    ++n;
  }
  EXPECT_GT(n, 200);
}

void check_corpus_ids_without_added_tokens_match_hf() {
  const Tokenizer& tok = v4_tokenizer();
  for (const auto& c : expected("v4_expected.json").at("cases")) {
    const std::string text = c.at("text");
    const std::vector<int32_t> ids = tok.encode(text, false);
    EXPECT_EQ(ids, ids_of(c.at("ids_plain"))) << "text: " << show(text);
    for (int32_t id : ids) EXPECT_LT(id, 128000) << "an added token leaked into " << show(text);
  }
}

void check_parse_special_false_spells_control_tokens_as_text() {
  const Tokenizer& tok = v4_tokenizer();
  const std::string text = "<｜User｜>hi<think>";
  EXPECT_EQ(tok.encode(text, true), (std::vector<int32_t>{128803, tok.encode("hi")[0], 128821}));
  const std::vector<int32_t> plain = tok.encode(text, false);
  EXPECT_GT(plain.size(), 3u);
  EXPECT_EQ(tok.decode(plain), text);
}

void check_decode_matches_hf() {
  const Tokenizer& tok = v4_tokenizer();
  for (const auto& c : expected("v4_expected.json").at("cases")) {
    const std::vector<int32_t> ids = ids_of(c.at("ids"));
    EXPECT_EQ(tok.decode(ids, false), c.at("decoded").get<std::string>());
    EXPECT_EQ(tok.decode(ids, true), c.at("decoded_skip_special").get<std::string>());
  }
  // Random id runs cut characters apart: HF replaces what is left incomplete.
  for (const auto& c : expected("v4_expected.json").at("decode_cases")) {
    const std::vector<int32_t> ids = ids_of(c.at("ids"));
    EXPECT_EQ(tok.decode(ids, false), c.at("text").get<std::string>());
    EXPECT_EQ(tok.decode(ids, true), c.at("text_skip_special").get<std::string>());
  }
}

void check_corpus_round_trips() {
  const Tokenizer& tok = v4_tokenizer();
  for (const auto& c : expected("v4_expected.json").at("cases")) {
    const std::string text = c.at("text");
    EXPECT_EQ(tok.decode(tok.encode(text, true)), text) << show(text);
    EXPECT_EQ(tok.decode(tok.encode(text, false)), text) << show(text);
  }
}

void check_random_text_round_trips() {
  const Tokenizer& tok = v4_tokenizer();
  std::mt19937 rng = fresh_rng();
  const std::vector<std::string> specials = {"<｜User｜>", "<think>", "</think>", "｜DSML｜",
                                             "<｜end▁of▁sentence｜>", "<｜User"};
  for (int i = 0; i < 300; ++i) {
    const std::string text = random_text(rng, 1 + int(rng() % 97), specials);
    ASSERT_EQ(tok.decode(tok.encode(text, true)), text) << show(text);
    ASSERT_EQ(tok.decode(tok.encode(text, false)), text) << show(text);
  }
}

void check_invalid_utf8_is_encoded_as_replacement_chars() {
  const Tokenizer& tok = v4_tokenizer();
  const std::string bad = "ok \xFF\xFE bytes \xE4\xBD then cut \xF0\x9F\x98";
  const std::string repaired = tokenizer::utf8_lossy(bad);
  EXPECT_NE(bad, repaired);
  EXPECT_EQ(tok.encode(bad), tok.encode(repaired));
  EXPECT_EQ(tok.decode(tok.encode(bad)), repaired);
}

void check_long_whitespace_and_digit_runs() {
  const Tokenizer& tok = v4_tokenizer();
  // One huge piece for the `\s+(?!\S)` alternative and for BPE.
  for (const std::string unit : {" ", "\t", "\n", "\xC2\xA0", "7", "a", "\xE4\xBD\xA0", "!"}) {
    std::string text;
    for (int i = 0; i < 200000; ++i) text += unit;
    text += "x";
    EXPECT_EQ(tok.decode(tok.encode(text)), text) << "run of " << show(unit);
  }
}

void check_concurrent_encodes_agree_with_hf() {
  // The piece cache is shared between threads; results must not depend on it.
  const Tokenizer& tok = v4_tokenizer();
  const auto& cases = expected("v4_expected.json").at("cases");
  std::vector<int> failures(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t k = 0; k < cases.size(); ++k) {
        const auto& c = cases[(k * 7 + size_t(t) * 13) % cases.size()];
        failures[size_t(t)] += tok.encode(c.at("text").get<std::string>()) != ids_of(c.at("ids"));
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(failures, std::vector<int>(4, 0));
}

void check_hundred_thousand_token_prompt_is_fast() {
  const Tokenizer& tok = v4_tokenizer();
  // A prompt built from the corpus, so it mixes every script and trap above;
  // a random suffix per run keeps the piece cache honest.
  std::mt19937 rng = fresh_rng();
  std::string prompt;
  const auto& cases = expected("v4_expected.json").at("cases");
  while (prompt.size() < 600000) {
    prompt += cases[rng() % cases.size()].at("text").get<std::string>();
    prompt += random_text(rng, 8);
  }
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = tok.encode(prompt);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("encoded %zu bytes into %zu tokens in %.3f s (%.2f MB/s)\n", prompt.size(),
              ids.size(), seconds, prompt.size() / seconds / 1e6);
  EXPECT_GE(ids.size(), 100000u);
  EXPECT_LT(seconds, 2.0);
  EXPECT_EQ(tok.decode(ids), prompt);
}

// Each test binary process loads the V4 file (~1 s), and ctest runs every
// TEST in its own process, so related checks share one TEST.
TEST(V4Tokenizer, SpecialTokensAndParseSpecial) {
  check_special_token_ids_are_v4s();
  check_parse_special_false_spells_control_tokens_as_text();
}

TEST(V4Tokenizer, CorpusMatchesHf) {
  check_corpus_ids_match_hf();
  check_corpus_ids_without_added_tokens_match_hf();
  check_decode_matches_hf();
  check_corpus_round_trips();
}

TEST(V4Tokenizer, RandomInvalidAndLongTextRoundTrips) {
  check_random_text_round_trips();
  check_invalid_utf8_is_encoded_as_replacement_chars();
  check_long_whitespace_and_digit_runs();
}

TEST(V4Tokenizer, ConcurrentEncodes) {
  check_concurrent_encodes_agree_with_hf();
}

TEST(V4Tokenizer, HundredThousandTokenPrompt) {
  check_hundred_thousand_token_prompt_is_fast();
}

}  // namespace
}  // namespace aff::tokenizer_test
