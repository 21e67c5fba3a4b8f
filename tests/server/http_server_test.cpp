// The HTTP layer against a scripted fake engine over real sockets: framing,
// errors, disconnects, the queue and bounded concurrent load.
#include <dirent.h>

#include <atomic>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "fake_engine.h"
#include "raw_http.h"
#include "server/http_server.h"
#include "tokenizer/chat_json.h"

namespace aff::server {
namespace {

using testing::Conn;
using testing::FakeEngine;
using testing::http;
using testing::HttpReply;
using tokenizer::Json;

int count_threads() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

class HttpServerTest : public ::testing::Test {
 protected:
  void start(ServerOptions o = {}) {
    o.port = 0;
    o.keepalive_ms = 100;
    o.http_threads = std::max(o.http_threads, 8);
    server_ = std::make_unique<Server>(engine_, o);
    ASSERT_TRUE(server_->start().is_ok());
    port_ = server_->port();
    ASSERT_GT(port_, 0);
  }
  void TearDown() override {
    if (server_) server_->stop();
  }
  HttpReply post(const std::string& path, const std::string& body) { return http(port_, "POST", path, body); }
  static Json json_of(const HttpReply& r) {
    Json j = Json::parse(r.body, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << r.body;
    return j;
  }
  // The SSE events ("data: ..." payloads) of a stream body; checks framing.
  static std::vector<std::string> sse_events(const std::string& body) {
    std::vector<std::string> out;
    size_t p = 0;
    while (p < body.size()) {
      size_t e = body.find("\n\n", p);
      EXPECT_NE(e, std::string::npos) << "unterminated event at " << p;
      if (e == std::string::npos) break;
      std::string ev = body.substr(p, e - p);
      p = e + 2;
      if (ev.rfind(": ping", 0) == 0) continue;
      EXPECT_EQ(ev.rfind("data: ", 0), 0u) << ev;
      out.push_back(ev.substr(6));
    }
    return out;
  }

  FakeEngine engine_;
  std::unique_ptr<Server> server_;
  int port_ = 0;
};

const char* kUserHi = R"({"messages":[{"role":"user","content":"Hi"}]})";
std::string with(const std::string& extra) { return std::string(kUserHi).substr(0, std::strlen(kUserHi) - 1) + "," + extra + "}"; }

TEST_F(HttpServerTest, HealthModelsMetricsTokenize) {
  start();
  HttpReply h = http(port_, "GET", "/health");
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(json_of(h)["status"], "ok");
  Json models = json_of(http(port_, "GET", "/v1/models"));
  EXPECT_EQ(models["object"], "list");
  ASSERT_EQ(models["data"].size(), 1u);
  EXPECT_EQ(models["data"][0]["id"], "fake-v4");
  EXPECT_EQ(http(port_, "GET", "/v1/models/fake-v4").status, 200);
  EXPECT_EQ(http(port_, "GET", "/v1/models/other").status, 404);
  HttpReply t = post("/tokenize", R"({"content":"<think>ab","with_pieces":true})");
  ASSERT_EQ(t.status, 200);
  Json tj = json_of(t);
  ASSERT_EQ(tj["tokens"].size(), 3u);
  EXPECT_EQ(tj["tokens"][0]["piece"], "<think>");
  Json plain = json_of(post("/tokenize", R"({"content":"<think>","parse_special":false})"));
  EXPECT_EQ(plain["tokens"].size(), 7u);
  Json detok = json_of(post("/detokenize", R"({"tokens":[4,113,114]})"));
  EXPECT_EQ(detok["content"], "<think>ab");
  EXPECT_EQ(post("/tokenize", R"({"content":5})").status, 400);
  post("/v1/chat/completions", kUserHi);
  HttpReply m = http(port_, "GET", "/metrics");
  EXPECT_EQ(m.status, 200);
  EXPECT_NE(m.body.find("affinity_server_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} 1"),
            std::string::npos)
      << m.body;
  EXPECT_NE(m.body.find("# TYPE affinity_server_generated_tokens_total counter"), std::string::npos);
}

TEST_F(HttpServerTest, ServesTheChatPage) {
  start();
  HttpReply page = http(port_, "GET", "/");
  ASSERT_EQ(page.status, 200);
  EXPECT_EQ(page.headers["content-type"].rfind("text/html", 0), 0u);
  EXPECT_NE(page.body.find("chat.js"), std::string::npos);
  HttpReply js = http(port_, "GET", "/chat.js");
  EXPECT_EQ(js.status, 200);
  EXPECT_NE(js.body.find("reasoning_content"), std::string::npos);
}

TEST_F(HttpServerTest, ChatNonStreamingSplitsReasoningAndContent) {
  engine_.set_script([](const std::string&) { return "Let me see.</think>Hello, world!"; });
  start();
  HttpReply r = post("/v1/chat/completions", kUserHi);
  ASSERT_EQ(r.status, 200) << r.body;
  Json j = json_of(r);
  EXPECT_EQ(j["object"], "chat.completion");
  const Json& msg = j["choices"][0]["message"];
  EXPECT_EQ(msg["role"], "assistant");
  EXPECT_EQ(msg["reasoning_content"], "Let me see.");
  EXPECT_EQ(msg["content"], "Hello, world!");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  const int64_t expected_completion = static_cast<int64_t>(engine_.tokenizer().encode("Let me see.</think>Hello, world!").size());
  EXPECT_EQ(j["usage"]["completion_tokens"], expected_completion);
  EXPECT_EQ(j["usage"]["prompt_tokens"], static_cast<int64_t>(engine_.tokenizer().encode(engine_.last_prompt()).size()));
  EXPECT_EQ(engine_.last_prompt(), "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜><think>");
}

TEST_F(HttpServerTest, ChatStreamingFraming) {
  engine_.set_script([](const std::string&) { return "Reason é.</think>Answer ✓ text"; });
  start();
  HttpReply r = post("/v1/chat/completions", with(R"("stream":true,"stream_options":{"include_usage":true})"));
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.headers["content-type"].rfind("text/event-stream", 0), 0u);
  auto events = sse_events(r.body);
  ASSERT_GE(events.size(), 4u);
  EXPECT_EQ(events.back(), "[DONE]");
  Json first = Json::parse(events[0]);
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string reasoning, content;
  Json finish, usage;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    Json c = Json::parse(events[i]);
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    EXPECT_EQ(c["id"], first["id"]);
    if (c.contains("usage")) {
      usage = c["usage"];
      EXPECT_TRUE(c["choices"].empty());
      EXPECT_EQ(i + 2, events.size()) << "usage must be the last chunk";
      continue;
    }
    const Json& d = c["choices"][0]["delta"];
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("content")) content += d["content"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(reasoning, "Reason é.");
  EXPECT_EQ(content, "Answer ✓ text");
  EXPECT_EQ(finish, "stop");
  EXPECT_EQ(usage["completion_tokens"].get<int64_t>() + usage["prompt_tokens"].get<int64_t>(),
            usage["total_tokens"].get<int64_t>());
}

TEST_F(HttpServerTest, ToolCallsStreamedAndWhole) {
  engine_.set_script([](const std::string&) {
    return "Need data.</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
           "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
           "<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
           "</｜DSML｜tool_calls>";
  });
  start();
  const std::string tools =
      R"("tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}])";
  Json whole = json_of(post("/v1/chat/completions", with(tools)));
  const Json& msg = whole["choices"][0]["message"];
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_TRUE(msg["content"].is_null());
  ASSERT_EQ(msg["tool_calls"].size(), 1u);
  EXPECT_EQ(msg["tool_calls"][0]["type"], "function");
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(Json::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            Json::parse(R"({"city":"Paris","days":3})"));
  EXPECT_NE(engine_.last_prompt().find("## Tools"), std::string::npos);

  auto events = sse_events(post("/v1/chat/completions", with(tools + R"(,"stream":true)")).body);
  std::string args, id;
  int starts = 0;
  std::string finish;
  for (const std::string& ev : events) {
    if (ev == "[DONE]") continue;
    Json c = Json::parse(ev);
    const Json& ch = c["choices"][0];
    if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
    if (!ch["delta"].contains("tool_calls")) continue;
    const Json& tc = ch["delta"]["tool_calls"][0];
    if (tc.contains("id")) {
      ++starts;
      id = tc["id"];
      EXPECT_EQ(tc["function"]["name"], "get_weather");
    }
    args += tc["function"]["arguments"].get<std::string>();
  }
  EXPECT_EQ(starts, 1);
  EXPECT_EQ(id.rfind("call_", 0), 0u);
  EXPECT_EQ(Json::parse(args), Json::parse(R"({"city":"Paris","days":3})"));
  EXPECT_EQ(finish, "tool_calls");

  // The round trip: the call and its result come back as history.
  std::string round = R"({"messages":[{"role":"user","content":"Weather?"},
    {"role":"assistant","content":null,"reasoning_content":"Need data.","tool_calls":[{"id":")" + id +
                      R"(","type":"function","function":{"name":"get_weather","arguments":)" +
                      tokenizer::python_json_dumps(Json(args)) + R"(}}]},
    {"role":"tool","tool_call_id":")" + id + R"(","content":"18C"}],)" + tools + "}";
  engine_.set_script([](const std::string&) { return "Got it.</think>It is 18C in Paris."; });
  Json final = json_of(post("/v1/chat/completions", round));
  EXPECT_EQ(final["choices"][0]["message"]["content"], "It is 18C in Paris.");
  EXPECT_NE(engine_.last_prompt().find("<｜User｜><tool_result>18C</tool_result><｜Assistant｜><think>"),
            std::string::npos);
}

TEST_F(HttpServerTest, MaxTokensFloorAndLength) {
  engine_.set_script([](const std::string&) { return "</think>0123456789abcdefghij"; });
  ServerOptions floor_on;  // default floor 256000: a small max_tokens is raised
  start(floor_on);
  Json a = json_of(post("/v1/chat/completions", with(R"("max_tokens":3)")));
  EXPECT_EQ(a["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(a["choices"][0]["message"]["content"], "0123456789abcdefghij");
  server_->stop();
  ServerOptions honour;
  honour.max_tokens_floor = 0;
  start(honour);
  Json b = json_of(post("/v1/chat/completions", with(R"("max_tokens":5)")));
  EXPECT_EQ(b["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(b["usage"]["completion_tokens"], 5);
  EXPECT_EQ(b["choices"][0]["message"]["content"], "0123");  // "</think>" is one token
}

TEST_F(HttpServerTest, StopStringsAndCompletions) {
  engine_.set_script([](const std::string&) { return "</think>one two STOP three"; });
  start();
  Json a = json_of(post("/v1/chat/completions", with(R"("stop":"STOP")")));
  EXPECT_EQ(a["choices"][0]["message"]["content"], "one two ");
  EXPECT_EQ(a["choices"][0]["finish_reason"], "stop");

  engine_.set_script([](const std::string& p) { return p == "<｜begin▁of▁sentence｜>Once" ? " upon a time" : "?"; });
  Json c = json_of(post("/v1/completions", R"({"prompt":"Once","max_tokens":50})"));
  EXPECT_EQ(c["object"], "text_completion");
  EXPECT_EQ(c["choices"][0]["text"], " upon a time");
  EXPECT_EQ(c["choices"][0]["finish_reason"], "stop");
  Json d = json_of(post("/v1/completions", R"({"prompt":"Once","max_tokens":4})"));
  EXPECT_EQ(d["choices"][0]["text"], " upo");
  EXPECT_EQ(d["choices"][0]["finish_reason"], "length");
  auto events = sse_events(post("/v1/completions", R"({"prompt":"Once","stream":true,"max_tokens":50})").body);
  std::string text;
  for (const auto& ev : events) {
    if (ev != "[DONE]") text += Json::parse(ev)["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, " upon a time");
  EXPECT_EQ(events.back(), "[DONE]");
}

TEST_F(HttpServerTest, MalformedRequestsGetJsonErrors) {
  ServerOptions o;
  o.max_body_bytes = 64 * 1024;
  start(o);
  auto expect_error = [&](const HttpReply& r, int status, const char* what) {
    EXPECT_EQ(r.status, status) << what << ": " << r.body;
    Json j = Json::parse(r.body, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << what << ": " << r.body;
    EXPECT_TRUE(j["error"]["message"].is_string()) << what;
    EXPECT_TRUE(j["error"]["type"].is_string()) << what;
  };
  expect_error(post("/v1/chat/completions", "{not json"), 400, "malformed JSON");
  expect_error(post("/v1/chat/completions", ""), 400, "empty body");
  expect_error(post("/v1/chat/completions", "[]"), 400, "array body");
  expect_error(post("/v1/chat/completions", R"({"messages":[{"role":"user","content":{"a":1}}]})"), 400, "content type");
  expect_error(post("/v1/chat/completions", with(R"("temperature":"warm")")), 400, "temperature type");
  expect_error(post("/v1/completions", R"({"prompt":[999999]})"), 400, "token out of vocab");
  expect_error(post("/v1/chat/completions", std::string(100 * 1024, ' ')), 413, "oversized body");
  const std::string huge_user(5000, 'x');  // 5000 byte tokens > 4096 context
  HttpReply big = post("/v1/chat/completions", R"({"messages":[{"role":"user","content":")" + huge_user + R"("}]})");
  expect_error(big, 413, "prompt beyond context");
  EXPECT_EQ(json_of(big)["error"]["code"], "context_length_exceeded");
  expect_error(http(port_, "GET", "/v1/nothing"), 404, "unknown route");
  EXPECT_EQ(http(port_, "GET", "/health").status, 200);
}

TEST_F(HttpServerTest, GarbageAndHalfRequestsDoNotWedgeTheServer) {
  start();
  std::mt19937 rng(std::random_device{}());
  for (int i = 0; i < 20; ++i) {
    Conn c(port_, 5);
    std::string junk(std::uniform_int_distribution<int>(1, 600)(rng), '\0');
    for (char& ch : junk) ch = static_cast<char>(rng());
    c.send_all(junk + "\r\n\r\n");
    // One reply (a 400) is enough; the connection may then be kept alive.
    HttpReply r = testing::parse_reply(c.recv_some());
    EXPECT_TRUE(r.status == 0 || r.status == 400 || r.status == 404 || r.status == 413) << r.status;
  }
  {
    // Headers promise a body that never fully arrives; the client then leaves.
    Conn c(port_, 5);
    c.send_all("POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 1000\r\n\r\n{\"messages\":");
  }
  // Fuzz: random byte edits of a valid body always give 200, 400 or 413.
  const std::string valid = with(R"("stream":true,"max_tokens":4,"tools":[{"type":"function","function":{"name":"f"}}])");
  for (int i = 0; i < 60; ++i) {
    std::string b = valid;
    const int edits = std::uniform_int_distribution<int>(1, 4)(rng);
    for (int e = 0; e < edits; ++e) {
      size_t pos = std::uniform_int_distribution<size_t>(0, b.size() - 1)(rng);
      b[pos] = "{}[]\",:0a\\ \x01\xff"[rng() % 14];
    }
    HttpReply r = post("/v1/chat/completions", b);
    EXPECT_TRUE(r.status == 200 || r.status == 400 || r.status == 413) << r.status << " for " << b;
  }
  EXPECT_EQ(http(port_, "GET", "/health").status, 200);
}

TEST_F(HttpServerTest, ClientDisconnectCancelsGeneration) {
  engine_.set_script([](const std::string&) { return "</think>" + std::string(3000, 'z'); });
  engine_.eval_delay_us = 2000;
  start();
  {
    Conn c(port_);
    ASSERT_TRUE(c.send_all(testing::make_request("POST", "/v1/chat/completions", with(R"("stream":true)"))));
    std::string got;
    while (got.find("\"content\":\"z\"") == std::string::npos) {
      std::string s = c.recv_some();
      ASSERT_FALSE(s.empty()) << "stream ended early";
      got += s;
    }
  }  // socket closed mid-stream
  // The generation must stop well before its 3000 tokens (~6 s).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  int64_t before = -1;
  while (std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const int64_t now = engine_.decode_evals.load();
    if (now == before) break;
    before = now;
  }
  EXPECT_LT(engine_.decode_evals.load(), 2000);
  HttpReply m = http(port_, "GET", "/metrics");
  EXPECT_NE(m.body.find("affinity_server_cancelled_total 1"), std::string::npos) << m.body;
  EXPECT_NE(m.body.find("affinity_server_requests_active 0"), std::string::npos) << m.body;
  // And the session is free for the next request.
  engine_.eval_delay_us = 0;
  engine_.set_script([](const std::string&) { return "</think>next"; });
  EXPECT_EQ(json_of(post("/v1/chat/completions", kUserHi))["choices"][0]["message"]["content"], "next");
}

TEST_F(HttpServerTest, QueueFullGives503) {
  engine_.set_script([](const std::string&) { return "</think>" + std::string(400, 'w'); });
  engine_.eval_delay_us = 5000;
  ServerOptions o;
  o.max_sessions = 1;
  o.max_queued = 0;
  start(o);
  Conn hold(port_);
  ASSERT_TRUE(hold.send_all(testing::make_request("POST", "/v1/chat/completions", with(R"("stream":true)"))));
  std::string got;
  while (got.find("\"content\":\"w\"") == std::string::npos) {
    std::string s = hold.recv_some();
    ASSERT_FALSE(s.empty());
    got += s;
  }
  HttpReply busy = post("/v1/chat/completions", kUserHi);
  EXPECT_EQ(busy.status, 503);
  EXPECT_EQ(json_of(busy)["error"]["code"], "queue_full");
  EXPECT_EQ(http(port_, "GET", "/health").status, 200);  // still answering
  hold.close();
}

TEST_F(HttpServerTest, BoundedConcurrentLoad) {
  engine_.set_script([](const std::string& p) {
    // Reply depends on the prompt so crossed wires between requests show.
    return "r</think>echo:" + p.substr(p.find("<｜User｜>") + std::strlen("<｜User｜>"), 8);
  });
  ServerOptions o;
  o.max_sessions = 4;
  o.max_queued = 64;
  start(o);
  http(port_, "GET", "/health");
  const int threads_before = count_threads();
  constexpr int kClients = 32, kRequests = 20;
  std::atomic<int> ok{0}, failed{0};
  std::vector<std::thread> clients;
  const auto t0 = std::chrono::steady_clock::now();
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      for (int i = 0; i < kRequests; ++i) {
        const std::string tag = fmt::format("c{:02}r{:02}__", c, i);
        const bool stream = (c + i) % 2 == 0;
        std::string body = R"({"messages":[{"role":"user","content":")" + tag + R"("}])" +
                           (stream ? R"(,"stream":true})" : "}");
        HttpReply r = http(port_, "POST", "/v1/chat/completions", body);
        bool good = r.status == 200;
        if (good && stream) {
          std::string content;
          auto events = sse_events(r.body);
          for (const std::string& ev : events) {
            if (ev == "[DONE]") continue;
            Json j = Json::parse(ev, nullptr, false);
            if (j.is_discarded() || j["choices"].empty()) continue;
            content += j["choices"][0]["delta"].value("content", "");
          }
          good = !events.empty() && events.back() == "[DONE]" && content == "echo:" + tag.substr(0, 8);
        } else if (good) {
          Json j = Json::parse(r.body, nullptr, false);
          good = !j.is_discarded() && j["choices"][0]["message"]["content"] == "echo:" + tag.substr(0, 8);
        }
        (good ? ok : failed)++;
      }
    });
  }
  for (auto& t : clients) t.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(ok.load(), kClients * kRequests);
  EXPECT_LT(secs, 60.0);
  RecordProperty("load_seconds", std::to_string(secs));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_LE(count_threads(), threads_before) << "threads leaked";
  HttpReply m = http(port_, "GET", "/metrics");
  EXPECT_NE(m.body.find("affinity_server_requests_active 0"), std::string::npos);
  EXPECT_NE(m.body.find("affinity_server_requests_queued 0"), std::string::npos);
}

TEST_F(HttpServerTest, StopWhileStreamingEndsCleanly) {
  engine_.set_script([](const std::string&) { return "</think>" + std::string(5000, 'q'); });
  engine_.eval_delay_us = 1000;
  start();
  Conn c(port_);
  ASSERT_TRUE(c.send_all(testing::make_request("POST", "/v1/chat/completions", with(R"("stream":true)"))));
  std::string got = c.recv_some();
  const auto t0 = std::chrono::steady_clock::now();
  server_->stop();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  server_.reset();
  EXPECT_EQ(engine_.live_sessions.load(), 0);
}

}  // namespace
}  // namespace aff::server
