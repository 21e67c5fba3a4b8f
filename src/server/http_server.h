// The OpenAI-compatible HTTP server. Talks to the model only through
// aff::Engine / aff::Session and the tokenizer; cpp-httplib stays inside
// http_server.cpp.
//
// Routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models
// (+ /v1/models/{id}), GET /health, GET /metrics, POST /tokenize,
// POST /detokenize, and the chat page (web/) at /.
#pragma once

#include <memory>

#include "affinity/engine.h"
#include "affinity/status.h"
#include "server/server_options.h"

namespace aff::server {

class Server {
 public:
  Server(Engine& engine, ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the socket and starts serving on a background thread.
  Status start();
  int port() const;  // the bound port (useful with options.port = 0)
  // Blocks until stop() is called (from another thread or a signal handler's
  // helper thread).
  void wait();
  // Stops accepting, cancels generations, joins threads. Idempotent.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// What `affinity -m MODEL --port N [--host ADDR]` calls: serves until the
// process ends or the server fails to bind.
Status run_server(Engine& engine, const ServerOptions& options);

}  // namespace aff::server
