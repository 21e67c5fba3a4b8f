// Request validation and response shaping, without HTTP.
#include <gtest/gtest.h>

#include "server/openai_request.h"
#include "server/openai_response.h"

namespace aff::server {
namespace {

using tokenizer::ChatVariant;

ApiError chat_error(const std::string& body) {
  auto r = parse_chat_request(Json::parse(body), ChatVariant::kV4_0731);
  EXPECT_TRUE(std::holds_alternative<ApiError>(r)) << body;
  return std::holds_alternative<ApiError>(r) ? std::get<ApiError>(r) : ApiError{};
}

ChatRequest chat_ok(const std::string& body, ChatVariant v = ChatVariant::kV4_0731) {
  auto r = parse_chat_request(Json::parse(body), v);
  EXPECT_TRUE(std::holds_alternative<ChatRequest>(r)) << body << ": "
                                                      << (std::holds_alternative<ApiError>(r) ? std::get<ApiError>(r).message : "");
  return std::holds_alternative<ChatRequest>(r) ? std::get<ChatRequest>(r) : ChatRequest{};
}

TEST(ChatRequest, WrongFieldTypesNameTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {R"([1,2])", ""},
      {R"({})", "messages"},
      {R"({"messages":"hi"})", "messages"},
      {R"({"messages":[{"role":"user","content":"x"}],"stream":"yes"})", "stream"},
      {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":"10"})", "max_tokens"},
      {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":0})", "max_tokens"},
      {R"({"messages":[{"role":"user","content":"x"}],"max_completion_tokens":1.5})", "max_completion_tokens"},
      {R"({"messages":[{"role":"user","content":"x"}],"temperature":3})", "temperature"},
      {R"({"messages":[{"role":"user","content":"x"}],"temperature":"hot"})", "temperature"},
      {R"({"messages":[{"role":"user","content":"x"}],"top_p":-1})", "top_p"},
      {R"({"messages":[{"role":"user","content":"x"}],"top_k":-3})", "top_k"},
      {R"({"messages":[{"role":"user","content":"x"}],"seed":"s"})", "seed"},
      {R"({"messages":[{"role":"user","content":"x"}],"stop":[1]})", "stop"},
      {R"({"messages":[{"role":"user","content":"x"}],"n":2})", "n"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":{}})", "tools"},
      {R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"required"})", "tool_choice"},
      {R"({"messages":[{"role":"user","content":"x"}],"reasoning_effort":"extreme"})", "reasoning_effort"},
      {R"({"messages":[{"role":"user","content":"x"}],"thinking":true})", "thinking"},
      {R"({"messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":1}})",
       "stream_options.include_usage"},
      {R"({"messages":[{"role":"user","content":"x"}],"model":7})", "model"},
      {R"({"messages":[{"role":"user","content":"x"}],"logprobs":true})", "logprobs"},
      {R"({"messages":[{"role":"bot","content":"x"}]})", "messages"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":3}}]})", "tools"},
  };
  for (const auto& [body, param] : cases) {
    ApiError e = chat_error(body);
    EXPECT_EQ(e.http_status, 400) << body;
    EXPECT_EQ(e.param, param) << body << " -> " << e.message;
    EXPECT_FALSE(e.message.empty());
    const Json j = e.to_json();
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  }
}

TEST(ChatRequest, ThinkingSwitchesAndEffort) {
  const std::string msgs = R"("messages":[{"role":"user","content":"x"}])";
  EXPECT_TRUE(chat_ok("{" + msgs + "}").thinking);
  EXPECT_FALSE(chat_ok("{" + msgs + R"(,"thinking":{"type":"disabled"}})").thinking);
  EXPECT_FALSE(chat_ok("{" + msgs + R"(,"reasoning_effort":"none"})").thinking);
  EXPECT_FALSE(chat_ok("{" + msgs + R"(,"model":"deepseek-chat"})").thinking);
  EXPECT_FALSE(chat_ok("{" + msgs + R"(,"chat_template_kwargs":{"enable_thinking":false}})").thinking);
  EXPECT_TRUE(chat_ok("{" + msgs + R"(,"model":"deepseek-reasoner","thinking":{"type":"disabled"}})").thinking);
  ChatRequest hi = chat_ok("{" + msgs + R"(,"reasoning_effort":"high"})");
  EXPECT_EQ(hi.prompt.find("Reasoning Effort: Absolute maximum"), std::string(tokenizer::kBosText).size());
  ChatRequest chat = chat_ok("{" + msgs + R"(,"thinking":{"type":"disabled"},"reasoning_effort":"max"})");
  EXPECT_EQ(chat.prompt.find("Reasoning Effort"), std::string::npos);
  EXPECT_TRUE(chat.prompt.ends_with("<｜Assistant｜></think>"));
}

TEST(ChatRequest, ToolsAndToolChoiceNone) {
  const std::string base = R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function",
      "function":{"name":"f","parameters":{"type":"object"}}}])";
  ChatRequest with = chat_ok(base + "}");
  EXPECT_TRUE(with.has_tools);
  EXPECT_NE(with.prompt.find("## Tools"), std::string::npos);
  ChatRequest none = chat_ok(base + R"(,"tool_choice":"none"})");
  EXPECT_FALSE(none.has_tools);
  EXPECT_EQ(none.prompt.find("## Tools"), std::string::npos);
}

TEST(ChatRequest, SamplingFieldsAreRead) {
  ChatRequest r = chat_ok(R"({"messages":[{"role":"user","content":"x"}],"temperature":0.25,"top_p":0.5,
      "top_k":17,"min_p":0.05,"seed":97,"stop":["END","\n\n"],"max_tokens":33,"stream":true,
      "stream_options":{"include_usage":true}})");
  EXPECT_FLOAT_EQ(r.common.sampling.temperature, 0.25f);
  EXPECT_FLOAT_EQ(r.common.sampling.top_p, 0.5f);
  EXPECT_EQ(r.common.sampling.top_k, 17);
  EXPECT_FLOAT_EQ(r.common.sampling.min_p, 0.05f);
  EXPECT_EQ(r.common.sampling.seed, 97u);
  EXPECT_EQ(r.common.stop.size(), 2u);
  EXPECT_EQ(*r.common.max_tokens, 33);
  EXPECT_TRUE(r.common.stream && r.common.include_usage);
}

TEST(CompletionRequest, PromptForms) {
  auto text = parse_completion_request(Json::parse(R"({"prompt":"abc"})"));
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(text));
  EXPECT_EQ(std::get<CompletionRequest>(text).prompt_text, "abc");
  EXPECT_EQ(*std::get<CompletionRequest>(text).common.max_tokens, 16);
  auto ids = parse_completion_request(Json::parse(R"({"prompt":[5,6,7],"max_tokens":3})"));
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(ids));
  EXPECT_EQ(std::get<CompletionRequest>(ids).prompt_tokens, (std::vector<int32_t>{5, 6, 7}));
  for (const char* bad : {R"({})", R"({"prompt":5})", R"({"prompt":["a","b"]})", R"({"prompt":[-1]})",
                          R"({"prompt":"a","echo":true})"}) {
    EXPECT_TRUE(std::holds_alternative<ApiError>(parse_completion_request(Json::parse(bad)))) << bad;
  }
}

TEST(MaxTokens, FloorAndContext) {
  EXPECT_EQ(resolve_max_tokens(10, 256000, 5000), 5000);  // floor raises, context caps
  EXPECT_EQ(resolve_max_tokens(10, 0, 5000), 10);         // 0 honours the caller
  EXPECT_EQ(resolve_max_tokens(std::nullopt, 0, 77), 77);
  EXPECT_EQ(resolve_max_tokens(900, 100, 5000), 900);
  EXPECT_EQ(resolve_max_tokens(10, 0, 0), 0);
}

TEST(StopMatcher, SplitAcrossPiecesAndHeldBack) {
  StopMatcher m({"STOP", "xyz"});
  EXPECT_EQ(m.push("abc ST"), "abc ");
  EXPECT_EQ(m.push("O"), "");
  EXPECT_EQ(m.push("P tail"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.push("more"), "");
  StopMatcher n({"STOP"});
  EXPECT_EQ(n.push("ST"), "");
  EXPECT_EQ(n.push("ale"), "STale");
  EXPECT_EQ(n.push("S"), "");
  EXPECT_EQ(n.finish(), "S");
  EXPECT_FALSE(n.stopped());
}

TEST(ChatResponse, StreamChunksConcatenateToTheFinalMessage) {
  const std::string text =
      "Plan.</think>Sure.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n"
      "<｜DSML｜parameter name=\"a\" string=\"true\">q\"x</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
  ChatResponseBuilder b("chatcmpl-1", "m", 1, true, {});
  std::string reasoning, content, args, name, id;
  auto take = [&](const std::vector<Json>& chunks) {
    for (const Json& c : chunks) {
      ASSERT_EQ(c["object"], "chat.completion.chunk");
      if (c["choices"].empty()) continue;
      const Json& d = c["choices"][0]["delta"];
      if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
      if (d.contains("content")) content += d["content"].get<std::string>();
      if (d.contains("tool_calls")) {
        const Json& tc = d["tool_calls"][0];
        EXPECT_EQ(tc["index"], 0);
        if (tc.contains("id")) id = tc["id"];
        if (tc["function"].contains("name")) name = tc["function"]["name"];
        args += tc["function"]["arguments"].get<std::string>();
      }
    }
  };
  for (size_t i = 0; i < text.size(); i += 3) take(b.push(text.substr(i, 3)));
  Usage u{10, 20, 4};
  auto tail = b.finish_stream(FinishReason::kStop, u, true);
  take(tail);
  EXPECT_EQ(reasoning, "Plan.");
  EXPECT_EQ(content, "Sure.");
  EXPECT_EQ(name, "f");
  EXPECT_EQ(args, "{\"a\": \"q\\\"x\"}");
  EXPECT_EQ(id.rfind("call_", 0), 0u);
  ASSERT_EQ(tail.size(), 2u);
  EXPECT_EQ(tail[0]["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_TRUE(tail[1]["choices"].empty());
  EXPECT_EQ(tail[1]["usage"]["total_tokens"], 30);
  EXPECT_EQ(tail[1]["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
}

TEST(ChatResponse, StopStringTruncatesContentOnly) {
  ChatResponseBuilder b("id", "m", 1, true, {"END"});
  b.push("thinking END is fine here</think>answer E");
  EXPECT_FALSE(b.stop_hit());
  b.push("ND ignored");
  EXPECT_TRUE(b.stop_hit());
  Json r = b.finish_response(FinishReason::kCancelled, {});
  EXPECT_EQ(r["choices"][0]["message"]["content"], "answer ");
  EXPECT_EQ(r["choices"][0]["message"]["reasoning_content"], "thinking END is fine here");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
}

TEST(ChatResponse, LengthAndInvalidUtf8) {
  ChatResponseBuilder b("id", "m", 1, false, {});
  b.push("abc\xff\xfe");
  Json r = b.finish_response(FinishReason::kLength, {});
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["choices"][0]["message"]["content"], "abc\xff\xfe");
  const std::string dumped = dump_json(r);  // must not throw on invalid UTF-8
  EXPECT_NE(dumped.find("abc"), std::string::npos);
}

TEST(ChatResponse, ToolCallCutByLengthReportsLength) {
  // max_tokens ran out inside a tool call: the call is incomplete, so the reply
  // must not claim finish_reason "tool_calls".
  ChatResponseBuilder b("id", "m", 1, false, {});
  b.push("Sure.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"true\">q");
  Json r = b.finish_response(FinishReason::kLength, {});
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
}

}  // namespace
}  // namespace aff::server
