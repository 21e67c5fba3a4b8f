// OpenAI request bodies -> validated generation requests. Pure functions, no
// HTTP: every malformed field becomes an ApiError naming that field.
#pragma once

#include <cstdint>
#include <optional>
#include <variant>
#include <string>
#include <vector>

#include "affinity/engine.h"
#include "tokenizer/chat_json.h"
#include "server/server_options.h"

namespace aff::server {

using tokenizer::Json;

// An OpenAI-style error: {"error":{"message","type","param","code"}}.
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // offending field, "" if none
  std::string code;   // machine-readable, "" if none

  Json to_json() const;
};

ApiError bad_request(std::string message, std::string param = "");

// Fields shared by /v1/chat/completions and /v1/completions.
struct CommonParams {
  std::string model;
  bool stream = false;
  bool include_usage = false;
  std::optional<int64_t> max_tokens;  // as sent; resolve_max_tokens applies the floor
  SamplingParams sampling;
  bool seed_given = false;
  std::vector<std::string> stop;
  bool ignore_eos = false;
};

struct ChatRequest {
  CommonParams common;
  std::string prompt;        // rendered V4 prompt text
  bool thinking = true;      // prompt ended in <think>: output starts as reasoning
  bool has_tools = false;
};

struct CompletionRequest {
  CommonParams common;
  std::string prompt_text;             // when the prompt was text
  std::vector<int32_t> prompt_tokens;  // when the prompt was token ids
};

// body: the parsed request JSON (any type; non-objects are rejected).
// On success the chat prompt is rendered with the given variant.
std::variant<ChatRequest, ApiError> parse_chat_request(const Json& body, tokenizer::ChatVariant variant);
std::variant<CompletionRequest, ApiError> parse_completion_request(const Json& body);

// Tokens to generate at most: the caller's value raised to the floor (chat
// only), capped by what the context has left after the prompt.
int64_t resolve_max_tokens(std::optional<int64_t> requested, int64_t floor, int64_t context_left);

}  // namespace aff::server
