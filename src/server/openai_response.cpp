#include "server/openai_response.h"

#include <random>

namespace aff::server {

std::string StopMatcher::push(std::string_view text) {
  if (stopped_) return {};
  held_.append(text);
  if (stops_.empty()) {
    std::string out;
    out.swap(held_);
    return out;
  }
  size_t first = std::string::npos;
  for (const std::string& s : stops_) first = std::min(first, held_.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Hold back the longest tail that is a prefix of some stop string.
  size_t hold = 0;
  for (const std::string& s : stops_) {
    for (size_t len = std::min(held_.size(), s.size() - 1); len > hold; --len) {
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return out;
}

std::string StopMatcher::finish() {
  if (stopped_) return {};
  std::string out;
  out.swap(held_);
  return out;
}

Json Usage::to_json() const {
  return Json{{"prompt_tokens", prompt_tokens},
              {"completion_tokens", completion_tokens},
              {"total_tokens", prompt_tokens + completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

ChatResponseBuilder::ChatResponseBuilder(std::string id, std::string model, int64_t created, bool thinking,
                                         std::vector<std::string> stops)
    : id_(std::move(id)), model_(std::move(model)), created_(created), parser_(thinking), stop_(std::move(stops)) {}

Json ChatResponseBuilder::chunk(Json delta, Json finish_reason) const {
  Json choice = {{"index", 0}, {"delta", std::move(delta)}, {"logprobs", nullptr}, {"finish_reason", finish_reason}};
  return Json{{"id", id_},
              {"object", "chat.completion.chunk"},
              {"created", created_},
              {"model", model_},
              {"choices", Json::array({choice})}};
}

Json ChatResponseBuilder::first_chunk() const { return chunk(Json{{"role", "assistant"}, {"content", ""}}); }

void ChatResponseBuilder::apply(const std::vector<tokenizer::ParserEvent>& events, std::vector<Json>* out) {
  using K = tokenizer::ParserEvent::Kind;
  for (const auto& e : events) {
    if (stop_.stopped()) return;  // nothing after a stop string is part of the answer
    switch (e.kind) {
      case K::kReasoning:
        if (out) out->push_back(chunk(Json{{"reasoning_content", e.text}}));
        break;
      case K::kContent: {
        std::string text = stop_.push(e.text);
        content_ += text;
        if (out && !text.empty()) out->push_back(chunk(Json{{"content", text}}));
        break;
      }
      case K::kToolCallStart: {
        // Content held back by a partial stop string is released first.
        std::string tail = stop_.finish();
        content_ += tail;
        if (out && !tail.empty()) out->push_back(chunk(Json{{"content", tail}}));
        call_ids_.push_back(new_call_id());
        Json call = {{"index", e.tool_index},
                     {"id", call_ids_.back()},
                     {"type", "function"},
                     {"function", {{"name", e.text}, {"arguments", ""}}}};
        if (out) out->push_back(chunk(Json{{"tool_calls", Json::array({call})}}));
        break;
      }
      case K::kToolCallArguments:
        if (out) {
          Json call = {{"index", e.tool_index}, {"function", {{"arguments", e.text}}}};
          out->push_back(chunk(Json{{"tool_calls", Json::array({call})}}));
        }
        break;
      case K::kToolCallEnd:
        break;
    }
  }
}

std::vector<Json> ChatResponseBuilder::push(std::string_view text) {
  std::vector<Json> out;
  apply(parser_.push(text), &out);
  return out;
}

const char* ChatResponseBuilder::finish_reason(FinishReason gen) const {
  // A reply cut by max_tokens is "length" even if a tool call had begun: the
  // call may be incomplete, and clients must not execute it as if it were whole.
  if (gen == FinishReason::kLength) return "length";
  if (parser_.saw_tool_calls()) return "tool_calls";
  if (stop_.stopped()) return "stop";
  return gen == FinishReason::kLength ? "length" : "stop";
}

std::vector<Json> ChatResponseBuilder::finish_stream(FinishReason gen, const Usage& usage, bool include_usage) {
  std::vector<Json> out;
  if (!finished_parser_) {
    apply(parser_.finish(), &out);
    std::string tail = stop_.finish();
    content_ += tail;
    if (!tail.empty()) out.push_back(chunk(Json{{"content", tail}}));
    finished_parser_ = true;
  }
  out.push_back(chunk(Json::object(), finish_reason(gen)));
  if (include_usage) {
    Json u = {{"id", id_},   {"object", "chat.completion.chunk"}, {"created", created_},
              {"model", model_}, {"choices", Json::array()},      {"usage", usage.to_json()}};
    out.push_back(std::move(u));
  }
  return out;
}

Json ChatResponseBuilder::finish_response(FinishReason gen, const Usage& usage) {
  if (!finished_parser_) {
    apply(parser_.finish(), nullptr);
    content_ += stop_.finish();
    finished_parser_ = true;
  }
  const tokenizer::ParsedMessage& m = parser_.message();
  Json message = {{"role", "assistant"}};
  message["content"] = content_.empty() && !m.tool_calls.empty() ? Json() : Json(content_);
  if (!m.reasoning_content.empty()) message["reasoning_content"] = m.reasoning_content;
  if (!m.tool_calls.empty()) {
    Json calls = Json::array();
    for (size_t i = 0; i < m.tool_calls.size(); ++i) {
      calls.push_back({{"id", i < call_ids_.size() ? call_ids_[i] : new_call_id()},
                       {"type", "function"},
                       {"function", {{"name", m.tool_calls[i].name}, {"arguments", m.tool_calls[i].arguments}}}});
    }
    message["tool_calls"] = calls;
  }
  Json choice = {{"index", 0}, {"message", message}, {"logprobs", nullptr}, {"finish_reason", finish_reason(gen)}};
  return Json{{"id", id_},
              {"object", "chat.completion"},
              {"created", created_},
              {"model", model_},
              {"choices", Json::array({choice})},
              {"usage", usage.to_json()}};
}

Json completion_chunk(const std::string& id, const std::string& model, int64_t created, const std::string& text,
                      const char* finish_reason) {
  Json choice = {{"index", 0}, {"text", text}, {"logprobs", nullptr},
                 {"finish_reason", finish_reason ? Json(finish_reason) : Json()}};
  return Json{{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model},
              {"choices", Json::array({choice})}};
}

Json completion_response(const std::string& id, const std::string& model, int64_t created, const std::string& text,
                         const char* finish_reason, const Usage& usage) {
  Json j = completion_chunk(id, model, created, text, finish_reason);
  j["usage"] = usage.to_json();
  return j;
}

namespace {
std::string random_alnum(size_t n) {
  static const char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng(std::random_device{}());
  std::string s(n, ' ');
  for (char& c : s) c = kAlphabet[rng() % (sizeof(kAlphabet) - 1)];
  return s;
}
}  // namespace

std::string new_call_id() { return "call_" + random_alnum(24); }
std::string new_request_id(const char* prefix) { return std::string(prefix) + random_alnum(24); }

std::string dump_json(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

std::string sse_data(const Json& j) { return "data: " + dump_json(j) + "\n\n"; }

}  // namespace aff::server
