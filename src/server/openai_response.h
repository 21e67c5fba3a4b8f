// Turns generated text into OpenAI response bodies: chat.completion(.chunk)
// and text_completion objects, stop strings, usage. No HTTP here, so every
// framing rule is unit-testable.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "server/generation_queue.h"
#include "server/openai_request.h"
#include "tokenizer/output_parser.h"

namespace aff::server {

// Finds the first stop string in streamed text, holding back a tail that
// could still become one. Once hit, everything after is discarded.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  std::string push(std::string_view text);  // text now safe to emit
  std::string finish();                     // held-back tail (if not stopped)
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;
  Json to_json() const;
};

// One chat completion: feed it generated text, get chunks (stream) or one
// final object.
class ChatResponseBuilder {
 public:
  ChatResponseBuilder(std::string id, std::string model, int64_t created, bool thinking,
                      std::vector<std::string> stops);

  // Stream chunks that became certain with this text (may be none).
  std::vector<Json> push(std::string_view text);
  // True once a stop string matched: the generation should be cancelled.
  bool stop_hit() const { return stop_.stopped(); }
  // Closing chunks: the last deltas, the finish_reason chunk and (if
  // include_usage) the usage chunk. gen: how the generation ended.
  std::vector<Json> finish_stream(FinishReason gen, const Usage& usage, bool include_usage);
  // The non-streaming chat.completion object.
  Json finish_response(FinishReason gen, const Usage& usage);
  const char* finish_reason(FinishReason gen) const;
  Json first_chunk() const;  // {"role":"assistant","content":""}

 private:
  Json chunk(Json delta, Json finish_reason = Json()) const;
  void apply(const std::vector<tokenizer::ParserEvent>& events, std::vector<Json>* out);

  std::string id_, model_;
  int64_t created_;
  tokenizer::OutputParser parser_;
  StopMatcher stop_;
  bool finished_parser_ = false;
  std::string content_;  // after stop-string truncation
  std::vector<std::string> call_ids_;
};

// /v1/completions objects (object "text_completion").
Json completion_chunk(const std::string& id, const std::string& model, int64_t created, const std::string& text,
                      const char* finish_reason);  // finish_reason nullptr = still running
Json completion_response(const std::string& id, const std::string& model, int64_t created, const std::string& text,
                         const char* finish_reason, const Usage& usage);

// Tool-call ids: "call_" + 24 random alphanumerics.
std::string new_call_id();
std::string new_request_id(const char* prefix);  // "chatcmpl-…", "cmpl-…"

// SSE framing: "data: <json>\n\n".
std::string sse_data(const Json& j);
inline constexpr const char* kSseDone = "data: [DONE]\n\n";
// JSON text safe for any bytes (invalid UTF-8 replaced, never throws).
std::string dump_json(const Json& j);

}  // namespace aff::server
