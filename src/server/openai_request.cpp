#include "server/openai_request.h"

#include <algorithm>
#include <limits>
#include <random>

#include <fmt/format.h>

namespace aff::server {

Json ApiError::to_json() const {
  Json err = {{"message", message}, {"type", type}};
  err["param"] = param.empty() ? Json() : Json(param);
  err["code"] = code.empty() ? Json(http_status) : Json(code);
  return Json{{"error", err}};
}

ApiError bad_request(std::string message, std::string param) {
  ApiError e;
  e.http_status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  return e;
}

namespace {

// Reads an optional field; absent and null both mean "not given".
const Json* field(const Json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<ApiError> read_bool(const Json& body, const char* name, bool* out) {
  if (const Json* v = field(body, name)) {
    if (!v->is_boolean()) return bad_request(fmt::format("'{}' must be a boolean", name), name);
    *out = v->get<bool>();
  }
  return std::nullopt;
}

std::optional<ApiError> read_number(const Json& body, const char* name, double lo, double hi, float* out) {
  if (const Json* v = field(body, name)) {
    if (!v->is_number()) return bad_request(fmt::format("'{}' must be a number", name), name);
    const double d = v->get<double>();
    if (!(d >= lo && d <= hi)) return bad_request(fmt::format("'{}' must be in [{}, {}]", name, lo, hi), name);
    *out = static_cast<float>(d);
  }
  return std::nullopt;
}

std::optional<ApiError> read_common(const Json& body, CommonParams* p) {
  if (const Json* v = field(body, "model")) {
    if (!v->is_string()) return bad_request("'model' must be a string", "model");
    p->model = v->get<std::string>();
  }
  if (auto e = read_bool(body, "stream", &p->stream)) return e;
  if (const Json* so = field(body, "stream_options")) {
    if (!so->is_object()) return bad_request("'stream_options' must be an object", "stream_options");
    if (auto e = read_bool(*so, "include_usage", &p->include_usage)) {
      e->param = "stream_options.include_usage";
      return e;
    }
  }
  for (const char* name : {"max_tokens", "max_completion_tokens"}) {
    if (const Json* v = field(body, name)) {
      if (!v->is_number_integer()) return bad_request(fmt::format("'{}' must be an integer", name), name);
      const int64_t n = v->get<int64_t>();
      if (n < 1) return bad_request(fmt::format("'{}' must be at least 1", name), name);
      p->max_tokens = n;
    }
  }
  // Model card: temperature 1.0, top_p 1.0 unless the client says otherwise.
  p->sampling.temperature = 1.0f;
  if (auto e = read_number(body, "temperature", 0.0, 2.0, &p->sampling.temperature)) return e;
  if (auto e = read_number(body, "top_p", 0.0, 1.0, &p->sampling.top_p)) return e;
  if (auto e = read_number(body, "min_p", 0.0, 1.0, &p->sampling.min_p)) return e;
  if (const Json* v = field(body, "top_k")) {
    if (!v->is_number_integer() || v->get<int64_t>() < 0 || v->get<int64_t>() > std::numeric_limits<int>::max()) {
      return bad_request("'top_k' must be a non-negative integer", "top_k");
    }
    p->sampling.top_k = static_cast<int>(v->get<int64_t>());
  }
  if (const Json* v = field(body, "seed")) {
    if (!v->is_number_integer()) return bad_request("'seed' must be an integer", "seed");
    p->sampling.seed = v->is_number_unsigned() ? v->get<uint64_t>() : static_cast<uint64_t>(v->get<int64_t>());
    p->seed_given = true;
  } else {
    p->sampling.seed = std::random_device{}() * 0x9E3779B97F4A7C15ull ^ std::random_device{}();
  }
  if (const Json* v = field(body, "stop")) {
    if (v->is_string()) {
      p->stop.push_back(v->get<std::string>());
    } else if (v->is_array()) {
      if (v->size() > 16) return bad_request("'stop' may hold at most 16 strings", "stop");
      for (const Json& s : *v) {
        if (!s.is_string()) return bad_request("'stop' must be a string or an array of strings", "stop");
        p->stop.push_back(s.get<std::string>());
      }
    } else {
      return bad_request("'stop' must be a string or an array of strings", "stop");
    }
    std::erase_if(p->stop, [](const std::string& s) { return s.empty(); });
  }
  if (const Json* v = field(body, "n")) {
    if (!v->is_number_integer() || v->get<int64_t>() != 1) return bad_request("only 'n' = 1 is supported", "n");
  }
  if (const Json* v = field(body, "logprobs")) {
    if (!v->is_boolean() && !v->is_number_integer()) return bad_request("'logprobs' must be a boolean", "logprobs");
    if ((v->is_boolean() && v->get<bool>()) || (v->is_number_integer() && v->get<int64_t>() > 0)) {
      return bad_request("'logprobs' is not supported", "logprobs");
    }
  }
  if (auto e = read_bool(body, "ignore_eos", &p->ignore_eos)) return e;
  return std::nullopt;
}

}  // namespace

std::variant<ChatRequest, ApiError> parse_chat_request(const Json& body, tokenizer::ChatVariant variant) {
  if (!body.is_object()) return bad_request("request body must be a JSON object");
  ChatRequest req;
  if (auto e = read_common(body, &req.common)) return *e;
  const Json* messages = field(body, "messages");
  if (!messages) return bad_request("'messages' is required", "messages");

  tokenizer::ChatEncodeOptions opts;
  opts.variant = variant;
  // Thinking is on by default (DeepSeek API, vLLM). Model aliases, DeepSeek's
  // thinking object, chat_template_kwargs and reasoning_effort "none" turn it off.
  if (req.common.model == "deepseek-chat") opts.thinking = false;
  if (const Json* t = field(body, "thinking")) {
    if (!t->is_object() || !t->contains("type") || !(*t)["type"].is_string()) {
      return bad_request("'thinking' must be an object like {\"type\": \"enabled\"}", "thinking");
    }
    const std::string type = (*t)["type"];
    if (type != "enabled" && type != "disabled") {
      return bad_request("'thinking.type' must be \"enabled\" or \"disabled\"", "thinking.type");
    }
    opts.thinking = type == "enabled";
  }
  std::string effort;
  if (const Json* kw = field(body, "chat_template_kwargs")) {
    if (!kw->is_object()) return bad_request("'chat_template_kwargs' must be an object", "chat_template_kwargs");
    for (const char* name : {"thinking", "enable_thinking"}) {
      bool on = opts.thinking;
      if (auto e = read_bool(*kw, name, &on)) {
        e->param = std::string("chat_template_kwargs.") + name;
        return *e;
      }
      opts.thinking = on;
    }
    if (auto e = read_bool(*kw, "drop_thinking", &opts.drop_thinking)) {
      e->param = "chat_template_kwargs.drop_thinking";
      return *e;
    }
    if (const Json* v = field(*kw, "reasoning_effort")) {
      if (!v->is_string()) return bad_request("'reasoning_effort' must be a string", "chat_template_kwargs.reasoning_effort");
      effort = v->get<std::string>();
    }
  }
  if (const Json* v = field(body, "reasoning_effort")) {
    if (!v->is_string()) return bad_request("'reasoning_effort' must be a string", "reasoning_effort");
    effort = v->get<std::string>();
  }
  if (req.common.model == "deepseek-reasoner") opts.thinking = true;
  if (!effort.empty()) {
    auto choice = tokenizer::resolve_reasoning_effort(variant, effort);
    if (!choice.is_ok()) return bad_request(choice.status().message(), "reasoning_effort");
    if (!choice->thinking) opts.thinking = false;
    opts.reasoning_effort = choice->level;
  }

  Json tools;
  if (const Json* t = field(body, "tools")) {
    if (!t->is_array()) return bad_request("'tools' must be an array", "tools");
    tools = *t;
  }
  if (const Json* tc = field(body, "tool_choice")) {
    // V4 has no native way to force a call; "none" is honoured by not
    // showing the tools, anything forcing a call is refused.
    if (tc->is_string() && *tc == "none") {
      tools = Json();
    } else if (!(tc->is_string() && *tc == "auto")) {
      return bad_request("'tool_choice' must be \"auto\" or \"none\" (V4 cannot be forced to call a tool)",
                         "tool_choice");
    }
  }
  if (const Json* v = field(body, "parallel_tool_calls")) {
    if (!v->is_boolean()) return bad_request("'parallel_tool_calls' must be a boolean", "parallel_tool_calls");
  }
  Json response_format;
  if (const Json* rf = field(body, "response_format")) {
    if (!rf->is_object() || !rf->contains("type") || !(*rf)["type"].is_string()) {
      return bad_request("'response_format' must be an object with a string 'type'", "response_format");
    }
    response_format = *rf;
  }
  req.has_tools = tools.is_array() && !tools.empty();

  if (messages->is_array() && !messages->empty()) {
    const Json& last = messages->back();
    opts.continue_final_message = last.is_object() && last.value("role", "") == "assistant";
  }
  auto prompt = tokenizer::encode_chat(*messages, tools, response_format, opts);
  if (!prompt.is_ok()) {
    const std::string& msg = prompt.status().message();
    std::string param = msg.rfind("tools", 0) == 0 ? "tools" : "messages";
    return bad_request(msg, param);
  }
  req.prompt = std::move(prompt).value();
  // The output starts as reasoning exactly when the prompt opened a think block.
  const std::string_view p = req.prompt;
  req.thinking = p.size() >= tokenizer::kThinkStartText.size() &&
                 p.substr(p.size() - tokenizer::kThinkStartText.size()) == tokenizer::kThinkStartText;
  return req;
}

std::variant<CompletionRequest, ApiError> parse_completion_request(const Json& body) {
  if (!body.is_object()) return bad_request("request body must be a JSON object");
  CompletionRequest req;
  if (auto e = read_common(body, &req.common)) return *e;
  // OpenAI's default for the legacy endpoint.
  if (!req.common.max_tokens) req.common.max_tokens = 16;
  const Json* prompt = field(body, "prompt");
  if (!prompt) return bad_request("'prompt' is required", "prompt");
  const Json* p = prompt;
  if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) p = &(*p)[0];
  if (p->is_string()) {
    req.prompt_text = p->get<std::string>();
  } else if (p->is_array() && !p->empty() && std::all_of(p->begin(), p->end(), [](const Json& t) {
               return t.is_number_integer() && t.get<int64_t>() >= 0 && t.get<int64_t>() <= INT32_MAX;
             })) {
    for (const Json& t : *p) req.prompt_tokens.push_back(static_cast<int32_t>(t.get<int64_t>()));
  } else {
    return bad_request("'prompt' must be a string or an array of token ids (one prompt per request)", "prompt");
  }
  if (field(body, "suffix")) return bad_request("'suffix' is not supported", "suffix");
  if (auto* e = field(body, "echo"); e && !(e->is_boolean() && !e->get<bool>())) {
    return bad_request("'echo' is not supported", "echo");
  }
  return req;
}

int64_t resolve_max_tokens(std::optional<int64_t> requested, int64_t floor, int64_t context_left) {
  int64_t n = requested.value_or(context_left);
  if (floor > 0) n = std::max(n, floor);
  return std::max<int64_t>(0, std::min(n, context_left));
}

}  // namespace aff::server
