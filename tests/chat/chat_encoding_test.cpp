// Chat encoding against golden prompts produced by the official V4 encoder
// (tools/chat/gen_chat_fixtures.py), plus the validation the server relies on.
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "tokenizer/chat_encoding.h"

namespace aff::tokenizer {
namespace {

Json load_fixture(const std::string& name) {
  std::ifstream f(std::string(AFFINITY_TEST_DATA) + "/chat/" + name);
  EXPECT_TRUE(f.good()) << "missing fixture " << name;
  std::stringstream ss;
  ss << f.rdbuf();
  return Json::parse(ss.str());
}

TEST(ChatEncoding, MatchesOfficialEncoderOnEveryFixture) {
  const Json cases = load_fixture("encoding_cases.json");
  ASSERT_GE(cases.size(), 20u);
  for (const Json& c : cases) {
    SCOPED_TRACE(c["name"].get<std::string>());
    ChatEncodeOptions o;
    const Json& opt = c["options"];
    auto variant = parse_chat_variant(opt["variant"].get<std::string>());
    ASSERT_TRUE(variant.is_ok());
    o.variant = *variant;
    o.thinking = opt["thinking"];
    o.reasoning_effort = opt["reasoning_effort"];
    o.drop_thinking = opt["drop_thinking"];
    auto prompt = encode_chat(c["messages"], c.value("tools", Json()), c.value("response_format", Json()), o);
    ASSERT_TRUE(prompt.is_ok()) << prompt.status().message();
    EXPECT_EQ(*prompt, c["prompt"].get<std::string>());
  }
}

TEST(ChatEncoding, ToolsPreambleIsPresentOnceAndDisablesDropThinking) {
  const Json cases = load_fixture("encoding_cases.json");
  for (const Json& c : cases) {
    if (c["name"] != "tool_round_trip_then_answer_then_user") continue;
    const std::string p = c["prompt"];
    EXPECT_EQ(p.find("## Tools"), p.rfind("## Tools"));
    // With tools present the reasoning of earlier turns is kept.
    EXPECT_NE(p.find("Need three calls.</think>"), std::string::npos);
    return;
  }
  FAIL() << "fixture case missing";
}

TEST(ChatEncoding, ContinueFinalAssistantMessageOmitsEos) {
  Json msgs = Json::parse(R"([{"role":"user","content":"Hi"},{"role":"assistant","content":"Hel"}])");
  ChatEncodeOptions o;
  o.thinking = false;
  o.continue_final_message = true;
  auto p = encode_chat(msgs, Json(), Json(), o);
  ASSERT_TRUE(p.is_ok());
  EXPECT_EQ(*p, "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜></think>Hel");
}

TEST(ChatEncoding, DeveloperRoleRendersAsSystem) {
  Json a = Json::parse(R"([{"role":"developer","content":"Rules."},{"role":"user","content":"x"}])");
  Json b = Json::parse(R"([{"role":"system","content":"Rules."},{"role":"user","content":"x"}])");
  auto pa = encode_chat(a, Json(), Json(), {});
  auto pb = encode_chat(b, Json(), Json(), {});
  ASSERT_TRUE(pa.is_ok() && pb.is_ok());
  EXPECT_EQ(*pa, *pb);
}

TEST(ChatEncoding, NonJsonToolArgumentsBecomeOneStringParameter) {
  Json msgs = Json::parse(R"([{"role":"user","content":"q"},
    {"role":"assistant","content":null,"tool_calls":[{"id":"a","type":"function",
      "function":{"name":"f","arguments":"not json {"}}]},
    {"role":"tool","tool_call_id":"a","content":"r"}])");
  auto p = encode_chat(msgs, Json(), Json(), {});
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_NE(p->find("<｜DSML｜parameter name=\"arguments\" string=\"true\">not json {</｜DSML｜parameter>"),
            std::string::npos);
}

TEST(ChatEncoding, RejectsMalformedMessagesNamingTheField) {
  struct Bad {
    const char* messages;
    const char* field;
  };
  const Bad bad[] = {
      {R"({"role":"user"})", "messages must be an array"},
      {R"([])", "messages must not be empty"},
      {R"([42])", "messages[0]"},
      {R"([{"content":"x"}])", "messages[0].role"},
      {R"([{"role":"wizard","content":"x"}])", "messages[0].role"},
      {R"([{"role":"user","content":7}])", "messages[0].content"},
      {R"([{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}])", "messages[0].content[0].type"},
      {R"([{"role":"user","content":"a"},{"role":"assistant","tool_calls":[{"function":{}}]}])",
       "messages[1].tool_calls[0].function.name"},
      {R"([{"role":"user","content":"a"},{"role":"assistant","reasoning_content":5}])",
       "messages[1].reasoning_content"},
  };
  for (const Bad& b : bad) {
    auto p = encode_chat(Json::parse(b.messages), Json(), Json(), {});
    ASSERT_FALSE(p.is_ok()) << b.messages;
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(p.status().message().find(b.field), std::string::npos) << p.status().message();
  }
  auto t = encode_chat(Json::parse(R"([{"role":"user","content":"a"}])"), Json::parse(R"([{"type":"function"}])"),
                       Json(), {});
  ASSERT_FALSE(t.is_ok());
  EXPECT_NE(t.status().message().find("tools[0].function"), std::string::npos);
}

TEST(ChatEncoding, ReasoningEffortTablesPerVariant) {
  EXPECT_EQ(*reasoning_effort_prefix(ChatVariant::kV4_0731, ""), "");
  EXPECT_EQ(*reasoning_effort_prefix(ChatVariant::kV4_0731, "low"), "");
  EXPECT_EQ(reasoning_effort_prefix(ChatVariant::kV4_0731, "high")->rfind("Reasoning Effort: Absolute maximum", 0), 0u);
  EXPECT_EQ(reasoning_effort_prefix(ChatVariant::kV4_0731, "max")->rfind("Reasoning Effort: Beyond maximum", 0), 0u);
  EXPECT_EQ(*reasoning_effort_prefix(ChatVariant::kV4, "high"), "");
  EXPECT_EQ(*reasoning_effort_prefix(ChatVariant::kV4, "max"), *reasoning_effort_prefix(ChatVariant::kV4_0731, "high"));
  EXPECT_FALSE(reasoning_effort_prefix(ChatVariant::kV4, "low").is_ok());

  auto none = resolve_reasoning_effort(ChatVariant::kV4_0731, "none");
  ASSERT_TRUE(none.is_ok());
  EXPECT_FALSE(none->thinking);
  EXPECT_EQ(resolve_reasoning_effort(ChatVariant::kV4_0731, "medium")->level, "high");
  EXPECT_EQ(resolve_reasoning_effort(ChatVariant::kV4_0731, "minimal")->level, "low");
  EXPECT_EQ(resolve_reasoning_effort(ChatVariant::kV4, "low")->level, "high");
  EXPECT_EQ(resolve_reasoning_effort(ChatVariant::kV4, "ultra")->level, "max");
  EXPECT_FALSE(resolve_reasoning_effort(ChatVariant::kV4, "extreme").is_ok());
}

TEST(ChatJson, MatchesPythonJsonDumps) {
  Json v = Json::parse(R"({"b": [1, 2.5, true, null, {"x": "y"}], "a": "é\"\\\n\u0001", "n": -0.125, "big": 1e20})");
  EXPECT_EQ(python_json_dumps(v),
            "{\"b\": [1, 2.5, true, null, {\"x\": \"y\"}], \"a\": \"é\\\"\\\\\\n\\u0001\", \"n\": -0.125, \"big\": 1e+20}");
}

}  // namespace
}  // namespace aff::tokenizer
