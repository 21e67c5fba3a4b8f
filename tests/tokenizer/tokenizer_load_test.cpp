// Loading hostile or unsupported tokenizer.json files: a Status naming the file
// and field, never a crash and never a tokenizer that silently disagrees with HF.
#include "tokenizer_fixtures.h"

namespace aff::tokenizer_test {
namespace {

using nlohmann::json;

// A small valid tokenizer.json in V4's shape, built in code so each test can
// break one field of it.
json minimal_spec() {
  json vocab = json::object();
  const char* tokens[] = {"a", "b", "c", "Ġ", "ab", "abc", "Ġa"};
  for (int i = 0; i < 7; ++i) vocab[tokens[i]] = i;
  return json{
      {"version", "1.0"},
      {"normalizer", {{"type", "Sequence"}, {"normalizers", json::array()}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", "\\s+|\\S+"}}}, {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"a b", "ab c", "Ġ a"}},
        {"byte_fallback", false}}},
      {"added_tokens",
       {{{"id", 7}, {"content", "<s>"}, {"special", true}, {"normalized", false}}}},
  };
}

Status load_status(const json& spec) {
  auto r = Tokenizer::load_from_json(spec.dump(), "test.json");
  return r.status();
}

TEST(TokenizerLoad, MinimalSpecWorks) {
  auto r = Tokenizer::load_from_json(minimal_spec().dump(), "test.json");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  const Tokenizer& tok = **r;
  EXPECT_EQ(tok.encode("abc ab<s>"), (std::vector<int32_t>{5, 3, 4, 7}));
  EXPECT_EQ(tok.vocab_size(), 8);
  EXPECT_TRUE(tok.is_special(7));
  EXPECT_EQ(tok.decode({5, 3, 7}, true), "abc ");
  // Bytes without a vocab entry are dropped, as HF's BPE does without unk_token.
  EXPECT_EQ(tok.encode("abz"), (std::vector<int32_t>{4}));
}

TEST(TokenizerLoad, MissingFileIsNotFound) {
  auto r = Tokenizer::load(data_path("no_such_tokenizer.json"));
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("no_such_tokenizer.json"), std::string::npos);
}

TEST(TokenizerLoad, LoadsFromAPath) {
  auto r = Tokenizer::load(data_path("tiny_tokenizer.json"));
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ((*r)->vocab_size(), tiny_tokenizer().vocab_size());
}

struct Breakage {
  const char* name;
  void (*apply)(json&);
  StatusCode code;
  const char* message_part;  // the field the error must name
};

TEST(TokenizerLoad, BrokenFieldsAreNamed) {
  const Breakage cases[] = {
      {"normalizer", [](json& j) { j["normalizer"] = {{"type", "NFC"}}; },
       StatusCode::kUnsupported, "normalizer"},
      {"split behaviour", [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; },
       StatusCode::kUnsupported, "behavior"},
      {"bad regex", [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(a"; },
       StatusCode::kUnsupported, "Split #0"},
      {"gpt2 regex", [](json& j) { j["pre_tokenizer"]["pretokenizers"][1]["use_regex"] = true; },
       StatusCode::kUnsupported, "use_regex"},
      {"no byte level", [](json& j) { j["pre_tokenizer"]["pretokenizers"].erase(1); },
       StatusCode::kUnsupported, "ByteLevel"},
      {"decoder", [](json& j) { j["decoder"] = nullptr; }, StatusCode::kUnsupported, "decoder"},
      {"model type", [](json& j) { j["model"]["type"] = "WordPiece"; }, StatusCode::kUnsupported,
       "model.type"},
      {"byte fallback", [](json& j) { j["model"]["byte_fallback"] = true; },
       StatusCode::kUnsupported, "byte_fallback"},
      {"vocab id", [](json& j) { j["model"]["vocab"]["a"] = -3; }, StatusCode::kCorrupt,
       "model.vocab"},
      {"merge token", [](json& j) { j["model"]["merges"].push_back("c zz"); },
       StatusCode::kCorrupt, "model.merges[3]"},
      {"merge shape", [](json& j) { j["model"]["merges"].push_back("abc"); },
       StatusCode::kCorrupt, "model.merges[3]"},
      {"merge result", [](json& j) { j["model"]["merges"].push_back("c a"); },
       StatusCode::kCorrupt, "\"ca\""},
      {"added id", [](json& j) { j["added_tokens"][0]["id"] = 9; }, StatusCode::kCorrupt,
       "would give it id 7"},
      {"added duplicate", [](json& j) { j["added_tokens"].push_back(j["added_tokens"][0]); },
       StatusCode::kCorrupt, "listed twice"},
      {"added flag type", [](json& j) { j["added_tokens"][0]["lstrip"] = "yes"; },
       StatusCode::kCorrupt, "added_tokens[0].lstrip"},
      {"model missing", [](json& j) { j.erase("model"); }, StatusCode::kCorrupt, "model"},
      {"pre_tokenizer type", [](json& j) { j["pre_tokenizer"] = 5; }, StatusCode::kCorrupt,
       "pre_tokenizer"},
  };
  for (const Breakage& b : cases) {
    json spec = minimal_spec();
    b.apply(spec);
    const Status s = load_status(spec);
    EXPECT_FALSE(s.is_ok()) << b.name;
    EXPECT_EQ(s.code(), b.code) << b.name << ": " << s.message();
    EXPECT_NE(s.message().find(b.message_part), std::string::npos) << b.name << ": " << s.message();
    EXPECT_NE(s.message().find("test.json"), std::string::npos) << b.name << ": " << s.message();
  }
}

TEST(TokenizerLoad, GarbageIsCorruptNotACrash) {
  std::mt19937 rng = fresh_rng();
  const std::string good = minimal_spec().dump();
  EXPECT_EQ(load_status(json::array()).code(), StatusCode::kCorrupt);
  for (int trial = 0; trial < 300; ++trial) {
    std::string bad = good;
    // Truncate or flip a few bytes: parse errors or wrong types, all reported.
    if (rng() % 2) bad.resize(1 + rng() % bad.size());
    for (int k = 0; k < 3; ++k) bad[rng() % bad.size()] = char(rng() % 256);
    auto r = Tokenizer::load_from_json(bad, "fuzz.json");
    if (r.is_ok()) {
      // A flip that kept the file valid must still give a working tokenizer.
      const std::vector<int32_t> ids = (*r)->encode("abc ab");
      for (int32_t id : ids) EXPECT_LT(id, (*r)->vocab_size());
    } else {
      EXPECT_NE(r.status().message().find("fuzz.json"), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace aff::tokenizer_test
