// Settings of the OpenAI-compatible HTTP server (`affinity -m MODEL --port N`).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "tokenizer/chat_encoding.h"

namespace aff::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                 // 0 = any free port (Server::port() tells which)
  // A request's max_tokens is raised to at least this: reasoning and answer
  // share one budget, so a client's small hard-coded value would truncate
  // the reasoning and return no answer. 0 honours the caller.
  int64_t max_tokens_floor = 256000;
  int max_sessions = 1;            // generations running at once, 1..4
  int max_queued = 64;             // requests waiting for a session before 503
  size_t max_body_bytes = 8u << 20;
  int http_threads = 64;           // a streaming request holds one for its whole life
  std::string web_root;            // static chat page; "" = the web/ folder of the source tree
  std::string model_id;            // name in /v1/models; "" = the engine's model name
  tokenizer::ChatVariant chat_variant = tokenizer::ChatVariant::kV4_0731;
  // Run one Session::eval at a time across sessions (the engine uses every
  // core for one eval; concurrent evals would only fight over them).
  bool serialize_engine = true;
  int keepalive_ms = 1000;         // SSE ": ping" / whitespace while nothing else is sent
  bool log_requests = false;
};

}  // namespace aff::server
