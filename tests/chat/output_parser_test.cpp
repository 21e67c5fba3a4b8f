// Output parser against completions rendered by the official encoder, fed
// whole, at every split point, byte by byte and in random pieces; plus
// malformed output a real model produces.
#include <fstream>
#include <random>
#include <sstream>

#include <gtest/gtest.h>

#include "tokenizer/chat_json.h"
#include "tokenizer/output_parser.h"

namespace aff::tokenizer {
namespace {

Json load_cases() {
  std::ifstream f(std::string(AFFINITY_TEST_DATA) + "/chat/parser_cases.json");
  EXPECT_TRUE(f.good());
  std::stringstream ss;
  ss << f.rdbuf();
  return Json::parse(ss.str());
}

// Feeds pieces, rebuilds the message from the *events* alone (what a streaming
// client sees) and checks it equals the parser's own accumulated message.
ParsedMessage feed(const std::vector<std::string>& pieces, bool thinking) {
  OutputParser p(thinking);
  ParsedMessage seen;
  auto apply = [&](const std::vector<ParserEvent>& evs) {
    for (const ParserEvent& e : evs) {
      switch (e.kind) {
        case ParserEvent::Kind::kReasoning: seen.reasoning_content += e.text; break;
        case ParserEvent::Kind::kContent: seen.content += e.text; break;
        case ParserEvent::Kind::kToolCallStart:
          EXPECT_EQ(e.tool_index, static_cast<int>(seen.tool_calls.size()));
          seen.tool_calls.push_back({e.text, ""});
          break;
        case ParserEvent::Kind::kToolCallArguments:
          EXPECT_EQ(e.tool_index, static_cast<int>(seen.tool_calls.size()) - 1);
          if (!seen.tool_calls.empty()) seen.tool_calls.back().arguments += e.text;
          break;
        case ParserEvent::Kind::kToolCallEnd: break;
      }
    }
  };
  for (const std::string& piece : pieces) apply(p.push(piece));
  apply(p.finish());
  EXPECT_EQ(seen.content, p.message().content);
  EXPECT_EQ(seen.reasoning_content, p.message().reasoning_content);
  EXPECT_EQ(seen.tool_calls.size(), p.message().tool_calls.size());
  return seen;
}

void expect_matches(const ParsedMessage& got, const Json& expected) {
  EXPECT_EQ(got.reasoning_content, expected["reasoning_content"].get<std::string>());
  EXPECT_EQ(got.content, expected["content"].get<std::string>());
  ASSERT_EQ(got.tool_calls.size(), expected["tool_calls"].size());
  for (size_t i = 0; i < got.tool_calls.size(); ++i) {
    EXPECT_EQ(got.tool_calls[i].name, expected["tool_calls"][i]["name"].get<std::string>());
    EXPECT_EQ(got.tool_calls[i].arguments, expected["tool_calls"][i]["arguments"].get<std::string>());
    EXPECT_TRUE(Json::accept(got.tool_calls[i].arguments)) << got.tool_calls[i].arguments;
  }
}

TEST(OutputParser, WholeCompletionMatchesFixture) {
  const Json cases = load_cases();
  ASSERT_GE(cases.size(), 8u);
  for (const Json& c : cases) {
    SCOPED_TRACE(c["name"].get<std::string>());
    expect_matches(feed({c["completion"].get<std::string>()}, c["thinking"]), c["expected"]);
  }
}

TEST(OutputParser, EverySplitPointGivesTheSameResult) {
  for (const Json& c : load_cases()) {
    const std::string text = c["completion"];
    SCOPED_TRACE(c["name"].get<std::string>());
    for (size_t cut = 0; cut <= text.size(); ++cut) {
      expect_matches(feed({text.substr(0, cut), text.substr(cut)}, c["thinking"]), c["expected"]);
      if (HasFailure()) {
        ADD_FAILURE() << "split at byte " << cut;
        return;
      }
    }
  }
}

TEST(OutputParser, ByteByByteAndRandomPieces) {
  std::mt19937 rng(std::random_device{}());
  for (const Json& c : load_cases()) {
    const std::string text = c["completion"];
    SCOPED_TRACE(c["name"].get<std::string>());
    std::vector<std::string> bytes;
    for (char ch : text) bytes.emplace_back(1, ch);
    expect_matches(feed(bytes, c["thinking"]), c["expected"]);
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<std::string> pieces;
      size_t pos = 0;
      while (pos < text.size()) {
        size_t len = std::uniform_int_distribution<size_t>(1, 9)(rng);
        pieces.push_back(text.substr(pos, len));
        pos += len;
      }
      expect_matches(feed(pieces, c["thinking"]), c["expected"]);
    }
  }
}

TEST(OutputParser, ArgumentsStreamBeforeTheCallEnds) {
  OutputParser p(false);
  p.push("\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"w\">\n<｜DSML｜parameter name=\"q\" string=\"true\">hel");
  ASSERT_EQ(p.message().tool_calls.size(), 1u);
  EXPECT_EQ(p.message().tool_calls[0].name, "w");
  EXPECT_EQ(p.message().tool_calls[0].arguments, "{\"q\": \"hel");
  EXPECT_EQ(p.message().content, "");
}

TEST(OutputParser, ContentNewlinesAreHeldOnlyUntilDecided) {
  OutputParser p(false);
  auto ev = p.push("Hello\n\n");
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].text, "Hello");
  ev = p.push("world");
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].text, "\n\nworld");
  p.push("\n");
  p.finish();
  EXPECT_EQ(p.message().content, "Hello\n\nworld\n");
}

TEST(OutputParser, TolerantOfMalformedOutput) {
  struct Case {
    const char* name;
    bool thinking;
    std::string text;
    std::string reasoning, content;
    std::vector<std::pair<std::string, std::string>> calls;
  };
  const std::vector<Case> cases = {
      {"no think end", true, "still thinking", "still thinking", "", {}},
      {"stray think end in content", false, "a</think>b", "", "ab", {}},
      {"duplicate think start", true, "<think>r</think>c", "r", "c", {}},
      {"think in chat mode", false, "<think>r</think>c", "r", "c", {}},
      {"tool block inside reasoning", true,
       "r<｜DSML｜tool_calls><｜DSML｜invoke name=\"f\"><｜DSML｜parameter name=\"a\" string=\"true\">x</｜DSML｜parameter></｜DSML｜invoke></｜DSML｜tool_calls>",
       "r", "", {{"f", "{\"a\": \"x\"}"}}},
      {"unclosed everything", false, "c\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"true\">x\"y",
       "", "c", {{"f", "{\"a\": \"x\\\"y\"}"}}},
      {"invalid non-string value", false,
       "<｜DSML｜tool_calls><｜DSML｜invoke name=\"f\"><｜DSML｜parameter name=\"n\" string=\"false\">12 apples</｜DSML｜parameter></｜DSML｜invoke></｜DSML｜tool_calls>",
       "", "", {{"f", "{\"n\": \"12 apples\"}"}}},
      {"missing string attribute", false,
       "<｜DSML｜tool_calls><｜DSML｜invoke name=\"f\"><｜DSML｜parameter name=\"n\">[1, 2]</｜DSML｜parameter><｜DSML｜parameter name=\"s\">word</｜DSML｜parameter></｜DSML｜invoke></｜DSML｜tool_calls>",
       "", "", {{"f", "{\"n\": [1, 2], \"s\": \"word\"}"}}},
      {"missing parameter close", false,
       "<｜DSML｜tool_calls><｜DSML｜invoke name=\"f\"><｜DSML｜parameter name=\"a\" string=\"true\">x<｜DSML｜parameter name=\"b\" string=\"false\">1</｜DSML｜invoke></｜DSML｜tool_calls>",
       "", "", {{"f", "{\"a\": \"x\", \"b\": 1}"}}},
      {"text after tool block dropped", false,
       "<｜DSML｜tool_calls><｜DSML｜invoke name=\"f\"></｜DSML｜invoke></｜DSML｜tool_calls>trailing junk", "", "",
       {{"f", "{}"}}},
      {"legacy function_calls block", false,
       "<｜DSML｜function_calls><｜DSML｜invoke name=\"g\"><｜DSML｜parameter name=\"k\" string=\"false\">true</｜DSML｜parameter></｜DSML｜invoke></｜DSML｜function_calls>",
       "", "", {{"g", "{\"k\": true}"}}},
      {"half marker at end is content", false, "see <｜DSML｜tool", "", "see <｜DSML｜tool", {}},
      {"unterminated invoke name is dropped", false, "<｜DSML｜tool_calls><｜DSML｜invoke name=\"abc", "", "", {}},
      {"lone angle brackets", false, "a < b <<< c </", "", "a < b <<< c </", {}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    for (size_t cut = 0; cut <= c.text.size(); ++cut) {
      ParsedMessage m = feed({c.text.substr(0, cut), c.text.substr(cut)}, c.thinking);
      EXPECT_EQ(m.reasoning_content, c.reasoning);
      EXPECT_EQ(m.content, c.content);
      ASSERT_EQ(m.tool_calls.size(), c.calls.size()) << "cut " << cut;
      for (size_t i = 0; i < c.calls.size(); ++i) {
        EXPECT_EQ(m.tool_calls[i].name, c.calls[i].first);
        EXPECT_EQ(m.tool_calls[i].arguments, c.calls[i].second);
        EXPECT_TRUE(Json::accept(m.tool_calls[i].arguments));
      }
      if (HasFailure()) return;
    }
  }
}

TEST(OutputParser, RandomGarbageNeverBreaksInvariants) {
  // Pieces drawn from marker fragments and text: the parser must never throw
  // and every emitted argument string must be valid JSON once finished.
  const std::vector<std::string> atoms = {"<", ">", "\"", "\n", "｜DSML｜", "<｜DSML｜", "</｜DSML｜", "tool_calls>",
                                          "invoke name=\"", "parameter name=\"x\" string=\"true\">",
                                          "parameter>", "invoke>", "</think>", "<think>", "abc", "{", "1", "é", "｜"};
  std::mt19937 rng(std::random_device{}());
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<std::string> pieces;
    const int n = std::uniform_int_distribution<int>(1, 60)(rng);
    for (int i = 0; i < n; ++i) pieces.push_back(atoms[std::uniform_int_distribution<size_t>(0, atoms.size() - 1)(rng)]);
    ParsedMessage m = feed(pieces, trial % 2 == 0);
    for (const auto& tc : m.tool_calls) EXPECT_TRUE(Json::accept(tc.arguments)) << tc.arguments;
  }
}

}  // namespace
}  // namespace aff::tokenizer
