// StreamingDecoder: text comes out as soon as it is complete UTF-8 and the
// whole stream equals Tokenizer::decode of the same ids.
#include "tokenizer/utf8.h"
#include "tokenizer_fixtures.h"

namespace aff::tokenizer_test {
namespace {

std::string stream_all(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip_special,
                       bool* every_push_valid) {
  StreamingDecoder dec(tok, skip_special);
  std::string out;
  *every_push_valid = true;
  for (int32_t id : ids) {
    const std::string piece = dec.push(id);
    *every_push_valid = *every_push_valid && tokenizer::utf8_is_valid(piece);
    out += piece;
  }
  out += dec.flush();
  return out;
}

void check_multi_byte_characters_split_across_tokens() {
  const Tokenizer& tok = v4_tokenizer();
  // Rare CJK, emoji with modifiers and ZWJ sequences are spelled with tokens
  // that hold only part of a character.
  const std::string text = "鿰 \xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA9 🫠🫡🧑🏽‍🚀 𠀋𠀌 ꙮ";
  const std::vector<int32_t> ids = tok.encode(text);
  int partial_tokens = 0;
  for (int32_t id : ids) partial_tokens += !tokenizer::utf8_is_valid(tok.token_bytes(id));
  ASSERT_GT(partial_tokens, 2) << "the text no longer exercises split characters";

  StreamingDecoder dec(tok);
  std::string out;
  for (int32_t id : ids) {
    const std::string piece = dec.push(id);
    EXPECT_TRUE(tokenizer::utf8_is_valid(piece));
    EXPECT_EQ(piece.find(tokenizer::kReplacementChar), std::string::npos);
    out += piece;
    EXPECT_EQ(text.compare(0, out.size(), out), 0) << "stream diverged from the text";
  }
  EXPECT_EQ(dec.flush(), "");
  EXPECT_EQ(out, text);
}

void check_holds_back_then_releases_one_character() {
  const Tokenizer& tok = v4_tokenizer();
  // Single-byte tokens, spelled with the GPT-2 byte map: 0xC3 -> "Ã", 0xA9 -> "©".
  const int32_t c3 = tok.token_id("Ã");
  const int32_t a9 = tok.token_id("©");
  ASSERT_GE(c3, 0);
  ASSERT_GE(a9, 0);
  ASSERT_EQ(tok.token_bytes(c3), "\xC3");
  StreamingDecoder dec(tok);
  EXPECT_EQ(dec.push(c3), "");
  EXPECT_EQ(dec.push(a9), "é");
  EXPECT_EQ(dec.push(c3), "");
  EXPECT_EQ(dec.flush(), tokenizer::kReplacementChar);  // cut off for good
  EXPECT_EQ(dec.flush(), "");
}

void check_invalid_bytes_are_replaced_at_once() {
  const Tokenizer& tok = v4_tokenizer();
  const int32_t ff = tok.token_id("ÿ");  // byte 0xFF, never valid in UTF-8
  const int32_t e2 = tok.token_id("â");  // 0xE2, a 3-byte lead
  const int32_t a = tok.token_id("A");
  ASSERT_GE(ff, 0);
  StreamingDecoder dec(tok);
  EXPECT_EQ(dec.push(ff), tokenizer::kReplacementChar);
  EXPECT_EQ(dec.push(e2), "");
  EXPECT_EQ(dec.push(a), std::string(tokenizer::kReplacementChar) + "A");
}

void check_random_id_streams_equal_decode() {
  for (const Tokenizer* tok : {&v4_tokenizer(), &tiny_tokenizer()}) {
    std::mt19937 rng = fresh_rng();
    for (int trial = 0; trial < 300; ++trial) {
      std::vector<int32_t> ids(1 + rng() % 41);
      for (int32_t& id : ids) {
        // Mostly byte tokens (ids of single bytes are low) to cut characters often.
        id = rng() % 3 == 0 ? int32_t(rng() % uint32_t(tok->vocab_size())) : int32_t(rng() % 300);
      }
      for (bool skip : {false, true}) {
        bool valid = false;
        EXPECT_EQ(stream_all(*tok, ids, skip, &valid), tok->decode(ids, skip));
        EXPECT_TRUE(valid);
      }
    }
  }
}

void check_skips_special_tokens_when_asked() {
  const Tokenizer& tok = v4_tokenizer();
  const std::vector<int32_t> ids = tok.encode("<｜begin▁of▁sentence｜>hi<｜User｜>x<｜end▁of▁sentence｜>");
  bool valid = false;
  EXPECT_EQ(stream_all(tok, ids, true, &valid), "hi<｜User｜>x");
  EXPECT_EQ(stream_all(tok, ids, false, &valid),
            "<｜begin▁of▁sentence｜>hi<｜User｜>x<｜end▁of▁sentence｜>");
}

// Each test binary process loads the V4 file (~1 s), and ctest runs every
// TEST in its own process, so related checks share one TEST.
TEST(StreamingDecoder, SplitCharactersAndByteTokens) {
  check_multi_byte_characters_split_across_tokens();
  check_holds_back_then_releases_one_character();
  check_invalid_bytes_are_replaced_at_once();
}

TEST(StreamingDecoder, StreamsEqualDecode) {
  check_random_id_streams_equal_decode();
  check_skips_special_tokens_when_asked();
}

}  // namespace
}  // namespace aff::tokenizer_test
