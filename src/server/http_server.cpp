// The one translation unit that includes cpp-httplib (it is heavy to compile).
#include "server/http_server.h"

#include <httplib.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "server/generation_queue.h"
#include "server/metrics.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
#include "tokenizer/tokenizer.h"

namespace aff::server {
namespace {

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// What differs between chat and text completions once tokens flow.
class OutputAdapter {
 public:
  virtual ~OutputAdapter() = default;
  virtual std::optional<Json> first_chunk() const = 0;
  virtual std::vector<Json> push(std::string_view text) = 0;
  virtual bool stop_hit() const = 0;
  virtual std::vector<Json> finish_stream(FinishReason gen, const Usage& usage, bool include_usage) = 0;
  virtual Json finish_response(FinishReason gen, const Usage& usage) = 0;
};

class ChatAdapter final : public OutputAdapter {
 public:
  ChatAdapter(std::string id, std::string model, bool thinking, std::vector<std::string> stops)
      : b_(std::move(id), std::move(model), unix_now(), thinking, std::move(stops)) {}
  std::optional<Json> first_chunk() const override { return b_.first_chunk(); }
  std::vector<Json> push(std::string_view text) override { return b_.push(text); }
  bool stop_hit() const override { return b_.stop_hit(); }
  std::vector<Json> finish_stream(FinishReason gen, const Usage& u, bool inc) override {
    return b_.finish_stream(gen, u, inc);
  }
  Json finish_response(FinishReason gen, const Usage& u) override { return b_.finish_response(gen, u); }

 private:
  ChatResponseBuilder b_;
};

class CompletionAdapter final : public OutputAdapter {
 public:
  CompletionAdapter(std::string id, std::string model, std::vector<std::string> stops)
      : id_(std::move(id)), model_(std::move(model)), created_(unix_now()), stop_(std::move(stops)) {}
  std::optional<Json> first_chunk() const override { return std::nullopt; }
  std::vector<Json> push(std::string_view text) override {
    std::string t = stop_.push(text);
    text_ += t;
    if (t.empty()) return {};
    return {completion_chunk(id_, model_, created_, t, nullptr)};
  }
  bool stop_hit() const override { return stop_.stopped(); }
  std::vector<Json> finish_stream(FinishReason gen, const Usage& u, bool inc) override {
    std::vector<Json> out;
    std::string tail = stop_.finish();
    text_ += tail;
    out.push_back(completion_chunk(id_, model_, created_, tail, reason(gen)));
    if (inc) {
      Json j = completion_chunk(id_, model_, created_, "", nullptr);
      j["choices"] = Json::array();
      j["usage"] = u.to_json();
      out.push_back(std::move(j));
    }
    return out;
  }
  Json finish_response(FinishReason gen, const Usage& u) override {
    text_ += stop_.finish();
    return completion_response(id_, model_, created_, text_, reason(gen), u);
  }

 private:
  const char* reason(FinishReason gen) const {
    return !stop_.stopped() && gen == FinishReason::kLength ? "length" : "stop";
  }
  std::string id_, model_;
  int64_t created_;
  StopMatcher stop_;
  std::string text_;
};

ApiError server_error(std::string message) {
  ApiError e;
  e.http_status = 500;
  e.type = "server_error";
  e.message = std::move(message);
  return e;
}

}  // namespace

struct Server::Impl {
  Engine& engine;
  ServerOptions opt;
  httplib::Server svr;
  std::unique_ptr<GenerationQueue> queue;
  Metrics metrics;
  std::thread listener;
  int port = -1;
  std::string model_id;
  int64_t created = unix_now();
  std::mutex stop_mu;
  bool stopped = false;

  Impl(Engine& e, ServerOptions o) : engine(e), opt(std::move(o)) {
    model_id = opt.model_id.empty() ? engine.info().name : opt.model_id;
    if (model_id.empty()) model_id = "affinity";
  }

  void reply_json(httplib::Response& res, int status, const Json& body, const char* endpoint) {
    res.status = status;
    res.set_content(dump_json(body), "application/json");
    metrics.count_request(endpoint, status);
  }
  void reply_error(httplib::Response& res, const ApiError& e, const char* endpoint) {
    reply_json(res, e.http_status, e.to_json(), endpoint);
  }

  // Body -> JSON; a parse failure is the client's 400.
  std::variant<Json, ApiError> parse_body(const httplib::Request& req) {
    Json body = Json::parse(req.body, nullptr, /*allow_exceptions=*/false);
    if (body.is_discarded()) return bad_request("request body is not valid JSON");
    return body;
  }

  void setup_routes();
  void handle_chat(const httplib::Request& req, httplib::Response& res);
  void handle_completion(const httplib::Request& req, httplib::Response& res);
  void handle_tokenize(const httplib::Request& req, httplib::Response& res);
  void handle_detokenize(const httplib::Request& req, httplib::Response& res);
  void serve_generation(httplib::Response& res, const char* endpoint, std::vector<int32_t> prompt,
                        const CommonParams& common, int64_t max_tokens, std::shared_ptr<OutputAdapter> out);
  std::string web_root() const;
};

std::string Server::Impl::web_root() const {
  if (!opt.web_root.empty()) return opt.web_root;
#ifdef AFFINITY_SOURCE_DIR
  return std::string(AFFINITY_SOURCE_DIR) + "/web";
#else
  return "web";
#endif
}

void Server::Impl::serve_generation(httplib::Response& res, const char* endpoint, std::vector<int32_t> prompt,
                                    const CommonParams& common, int64_t max_tokens,
                                    std::shared_ptr<OutputAdapter> out) {
  const int64_t n_prompt = static_cast<int64_t>(prompt.size());
  JobSpec spec;
  spec.prompt = std::move(prompt);
  spec.sampling = common.sampling;
  spec.max_tokens = max_tokens;
  spec.ignore_eos = common.ignore_eos;
  std::shared_ptr<Job> job = queue->submit(std::move(spec));
  if (!job) {
    ApiError e;
    e.http_status = 503;
    e.type = "server_busy";
    e.code = "queue_full";
    e.message = "the request queue is full; retry later";
    res.set_header("Retry-After", "1");
    return reply_error(res, e, endpoint);
  }
  const auto keepalive = std::chrono::milliseconds(std::max(50, opt.keepalive_ms));
  auto usage_of = [job, n_prompt] {
    Usage u;
    u.prompt_tokens = n_prompt;
    u.completion_tokens = job->generated_tokens.load();
    u.cached_tokens = job->cached_tokens;
    return u;
  };

  if (!common.stream) {
    // Wait for the prompt in this thread so that a prompt the engine refuses
    // still gets a real error status; then stream the JSON body, writing
    // whitespace (valid before a JSON value) while generating, so a client
    // that went away is noticed and its generation cancelled.
    std::vector<GenEvent> first;
    while (first.empty()) first = job->wait_events(keepalive);
    for (const GenEvent& e : first) {
      if (e.kind == GenEvent::Kind::kDone && e.finish == FinishReason::kError) {
        return reply_error(res, server_error(e.error), endpoint);
      }
    }
    auto pending = std::make_shared<std::vector<GenEvent>>(std::move(first));
    metrics.count_request(endpoint, 200);
    res.set_chunked_content_provider(
        "application/json",
        [this, job, out, pending, keepalive, usage_of](size_t, httplib::DataSink& sink) {
          std::vector<GenEvent> evs;
          evs.swap(*pending);
          if (evs.empty()) evs = job->wait_events(keepalive);
          if (evs.empty()) {
            if (!sink.write(" ", 1)) {
              job->cancel();
              return false;
            }
            return true;
          }
          for (const GenEvent& e : evs) {
            if (e.kind == GenEvent::Kind::kText) {
              out->push(e.text);
              if (out->stop_hit()) job->cancel();
            } else if (e.kind == GenEvent::Kind::kDone) {
              std::string body = e.finish == FinishReason::kError ? dump_json(server_error(e.error).to_json())
                                                                   : dump_json(out->finish_response(e.finish, usage_of()));
              if (!sink.write(body.data(), body.size())) return false;
              sink.done();
              return true;
            }
          }
          return true;
        },
        [job](bool) { job->cancel(); });
    return;
  }

  metrics.count_request(endpoint, 200);
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  auto sent_first = std::make_shared<bool>(false);
  res.set_chunked_content_provider(
      "text/event-stream",
      [job, out, sent_first, keepalive, usage_of, include_usage = common.include_usage](size_t,
                                                                                        httplib::DataSink& sink) {
        auto write = [&](const std::string& s) {
          if (sink.write(s.data(), s.size())) return true;
          job->cancel();  // the client is gone
          return false;
        };
        if (!*sent_first) {
          *sent_first = true;
          if (auto c = out->first_chunk(); c && !write(sse_data(*c))) return false;
        }
        std::vector<GenEvent> evs = job->wait_events(keepalive);
        if (evs.empty()) return write(": ping\n\n");
        std::string batch;
        for (const GenEvent& e : evs) {
          if (e.kind == GenEvent::Kind::kText) {
            for (const Json& c : out->push(e.text)) batch += sse_data(c);
            if (out->stop_hit()) job->cancel();
          } else if (e.kind == GenEvent::Kind::kDone) {
            if (e.finish == FinishReason::kError) {
              batch += sse_data(server_error(e.error).to_json());
            } else {
              for (const Json& c : out->finish_stream(e.finish, usage_of(), include_usage)) batch += sse_data(c);
            }
            batch += kSseDone;
            if (!write(batch)) return false;
            sink.done();
            return true;
          }
        }
        return batch.empty() || write(batch);
      },
      [job](bool) { job->cancel(); });
}

void Server::Impl::handle_chat(const httplib::Request& req, httplib::Response& res) {
  const char* ep = "/v1/chat/completions";
  auto body = parse_body(req);
  if (auto* e = std::get_if<ApiError>(&body)) return reply_error(res, *e, ep);
  auto parsed = parse_chat_request(std::get<Json>(body), opt.chat_variant);
  if (auto* e = std::get_if<ApiError>(&parsed)) return reply_error(res, *e, ep);
  ChatRequest& chat = std::get<ChatRequest>(parsed);

  const Tokenizer& tok = engine.tokenizer();
  std::vector<int32_t> prompt = tok.encode(chat.prompt, /*parse_special=*/true);
  const int64_t ctx = engine.info().max_context;
  if (static_cast<int64_t>(prompt.size()) >= ctx) {
    ApiError e = bad_request(fmt::format("the prompt is {} tokens; this server's context holds {} "
                                         "(prompt and completion together)", prompt.size(), ctx),
                             "messages");
    e.http_status = 413;
    e.code = "context_length_exceeded";
    return reply_error(res, e, ep);
  }
  const int64_t max_tokens =
      resolve_max_tokens(chat.common.max_tokens, opt.max_tokens_floor, ctx - static_cast<int64_t>(prompt.size()));
  auto out = std::make_shared<ChatAdapter>(new_request_id("chatcmpl-"),
                                           chat.common.model.empty() ? model_id : chat.common.model, chat.thinking,
                                           chat.common.stop);
  serve_generation(res, ep, std::move(prompt), chat.common, max_tokens, out);
}

void Server::Impl::handle_completion(const httplib::Request& req, httplib::Response& res) {
  const char* ep = "/v1/completions";
  auto body = parse_body(req);
  if (auto* e = std::get_if<ApiError>(&body)) return reply_error(res, *e, ep);
  auto parsed = parse_completion_request(std::get<Json>(body));
  if (auto* e = std::get_if<ApiError>(&parsed)) return reply_error(res, *e, ep);
  CompletionRequest& cr = std::get<CompletionRequest>(parsed);

  const Tokenizer& tok = engine.tokenizer();
  const ModelInfo& info = engine.info();
  std::vector<int32_t> prompt;
  if (!cr.prompt_tokens.empty()) {
    for (int32_t id : cr.prompt_tokens) {
      if (id >= tok.vocab_size()) {
        return reply_error(res, bad_request(fmt::format("token id {} is outside the vocabulary", id), "prompt"), ep);
      }
    }
    prompt = cr.prompt_tokens;
  } else {
    // Raw text continues from BOS unless the client wrote it themselves.
    if (cr.prompt_text.rfind(tokenizer::kBosText, 0) != 0) prompt.push_back(info.bos_id);
    std::vector<int32_t> ids = tok.encode(cr.prompt_text, /*parse_special=*/true);
    prompt.insert(prompt.end(), ids.begin(), ids.end());
  }
  const int64_t ctx = info.max_context;
  if (static_cast<int64_t>(prompt.size()) >= ctx) {
    ApiError e = bad_request(fmt::format("the prompt is {} tokens; the context holds {}", prompt.size(), ctx), "prompt");
    e.http_status = 413;
    e.code = "context_length_exceeded";
    return reply_error(res, e, ep);
  }
  // The floor exists for chat reasoning; a raw completion honours the caller.
  const int64_t max_tokens = resolve_max_tokens(cr.common.max_tokens, 0, ctx - static_cast<int64_t>(prompt.size()));
  auto out = std::make_shared<CompletionAdapter>(new_request_id("cmpl-"),
                                                 cr.common.model.empty() ? model_id : cr.common.model, cr.common.stop);
  serve_generation(res, ep, std::move(prompt), cr.common, max_tokens, out);
}

void Server::Impl::handle_tokenize(const httplib::Request& req, httplib::Response& res) {
  const char* ep = "/tokenize";
  auto body = parse_body(req);
  if (auto* e = std::get_if<ApiError>(&body)) return reply_error(res, *e, ep);
  const Json& j = std::get<Json>(body);
  if (!j.is_object() || !j.contains("content") || !j["content"].is_string()) {
    return reply_error(res, bad_request("'content' must be a string", "content"), ep);
  }
  bool add_special = false, parse_special = true, with_pieces = false;
  for (auto [name, dst] : {std::pair{"add_special", &add_special}, std::pair{"parse_special", &parse_special},
                           std::pair{"with_pieces", &with_pieces}}) {
    if (j.contains(name) && !j[name].is_null()) {
      if (!j[name].is_boolean()) return reply_error(res, bad_request(fmt::format("'{}' must be a boolean", name), name), ep);
      *dst = j[name].get<bool>();
    }
  }
  const Tokenizer& tok = engine.tokenizer();
  std::vector<int32_t> ids;
  if (add_special) ids.push_back(engine.info().bos_id);
  std::vector<int32_t> body_ids = tok.encode(j["content"].get<std::string>(), parse_special);
  ids.insert(ids.end(), body_ids.begin(), body_ids.end());
  Json tokens = Json::array();
  for (int32_t id : ids) {
    if (with_pieces) {
      tokens.push_back({{"id", id}, {"piece", tok.token_bytes(id)}});
    } else {
      tokens.push_back(id);
    }
  }
  reply_json(res, 200, Json{{"tokens", tokens}}, ep);
}

void Server::Impl::handle_detokenize(const httplib::Request& req, httplib::Response& res) {
  const char* ep = "/detokenize";
  auto body = parse_body(req);
  if (auto* e = std::get_if<ApiError>(&body)) return reply_error(res, *e, ep);
  const Json& j = std::get<Json>(body);
  const Tokenizer& tok = engine.tokenizer();
  if (!j.is_object() || !j.contains("tokens") || !j["tokens"].is_array()) {
    return reply_error(res, bad_request("'tokens' must be an array of token ids", "tokens"), ep);
  }
  std::vector<int32_t> ids;
  for (const Json& t : j["tokens"]) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= tok.vocab_size()) {
      return reply_error(res, bad_request("'tokens' must hold ids inside the vocabulary", "tokens"), ep);
    }
    ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  reply_json(res, 200, Json{{"content", tok.decode(ids)}}, ep);
}

void Server::Impl::setup_routes() {
  svr.new_task_queue = [n = std::max(4, opt.http_threads)] { return new httplib::ThreadPool(n); };
  svr.set_payload_max_length(opt.max_body_bytes);
  svr.set_read_timeout(30);
  svr.set_write_timeout(30);

  svr.Post("/v1/chat/completions", [this](const httplib::Request& q, httplib::Response& r) { handle_chat(q, r); });
  svr.Post("/chat/completions", [this](const httplib::Request& q, httplib::Response& r) { handle_chat(q, r); });
  svr.Post("/v1/completions", [this](const httplib::Request& q, httplib::Response& r) { handle_completion(q, r); });
  svr.Post("/completions", [this](const httplib::Request& q, httplib::Response& r) { handle_completion(q, r); });
  svr.Post("/tokenize", [this](const httplib::Request& q, httplib::Response& r) { handle_tokenize(q, r); });
  svr.Post("/detokenize", [this](const httplib::Request& q, httplib::Response& r) { handle_detokenize(q, r); });

  auto model_obj = [this] {
    const ModelInfo& info = engine.info();
    return Json{{"id", model_id},
                {"object", "model"},
                {"created", created},
                {"owned_by", "affinity"},
                {"meta", {{"n_ctx", info.max_context}, {"n_vocab", info.vocab_size}, {"source", info.name}}}};
  };
  svr.Get("/v1/models", [this, model_obj](const httplib::Request&, httplib::Response& r) {
    reply_json(r, 200, Json{{"object", "list"}, {"data", Json::array({model_obj()})}}, "/v1/models");
  });
  svr.Get(R"(/v1/models/(.+))", [this, model_obj](const httplib::Request& q, httplib::Response& r) {
    if (q.matches[1] == model_id) return reply_json(r, 200, model_obj(), "/v1/models");
    ApiError e;
    e.http_status = 404;
    e.type = "not_found_error";
    e.code = "model_not_found";
    e.param = "model";
    e.message = fmt::format("model '{}' is not loaded; this server serves '{}'", std::string(q.matches[1]), model_id);
    reply_error(r, e, "/v1/models");
  });
  auto health = [this](const httplib::Request&, httplib::Response& r) {
    reply_json(r, 200, Json{{"status", "ok"}}, "/health");
  };
  svr.Get("/health", health);
  svr.Get("/v1/health", health);
  svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& r) {
    metrics.count_request("/metrics", 200);
    r.set_content(metrics.render(queue->stats()), "text/plain; version=0.0.4");
  });

  const std::string root = web_root();
  if (std::filesystem::is_directory(root)) svr.set_mount_point("/", root);

  // httplib answers some errors itself (unknown route, body too large, bad
  // request line); give those the same JSON shape as ours.
  svr.set_error_handler([this](const httplib::Request& q, httplib::Response& r) {
    if (!r.body.empty()) return;
    ApiError e;
    e.http_status = r.status;
    if (r.status == 404) {
      e.type = "not_found_error";
      e.message = fmt::format("no route for {} {}", q.method, q.path);
    } else if (r.status == 413) {
      e.code = "payload_too_large";
      e.message = fmt::format("request body exceeds {} bytes", opt.max_body_bytes);
    } else {
      e.message = fmt::format("HTTP {}", r.status);
    }
    r.set_content(dump_json(e.to_json()), "application/json");
    metrics.count_request("error", r.status);
  });
  svr.set_exception_handler([this](const httplib::Request&, httplib::Response& r, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& ex) {
      what = ex.what();
    } catch (...) {
    }
    reply_error(r, server_error(what), "exception");
  });
  if (opt.log_requests) {
    svr.set_logger([](const httplib::Request& q, const httplib::Response& r) {
      std::fprintf(stderr, "affinity: %s %s -> %d\n", q.method.c_str(), q.path.c_str(), r.status);
    });
  }
}

Server::Server(Engine& engine, ServerOptions options) : impl_(std::make_unique<Impl>(engine, std::move(options))) {}

Server::~Server() {
  stop();
  if (impl_->listener.joinable()) impl_->listener.join();
}

Status Server::start() {
  Impl& s = *impl_;
  if (s.opt.max_sessions < 1 || s.opt.max_sessions > 4) {
    return invalid_argument(fmt::format("max_sessions must be 1..4 (got {})", s.opt.max_sessions));
  }
  s.queue = std::make_unique<GenerationQueue>(s.engine, s.opt.max_sessions, s.opt.max_queued, s.opt.serialize_engine);
  s.setup_routes();
  if (s.opt.port == 0) {
    s.port = s.svr.bind_to_any_port(s.opt.host);
    if (s.port < 0) return io_error(fmt::format("cannot bind {} (any port)", s.opt.host));
  } else {
    if (!s.svr.bind_to_port(s.opt.host, s.opt.port)) {
      return io_error(fmt::format("cannot bind {}:{} (in use, or not a local address?)", s.opt.host, s.opt.port));
    }
    s.port = s.opt.port;
  }
  s.listener = std::thread([&s] { s.svr.listen_after_bind(); });
  return Status::ok();
}

int Server::port() const { return impl_->port; }

void Server::wait() {
  if (impl_->listener.joinable()) impl_->listener.join();
}

void Server::stop() {
  Impl& s = *impl_;
  std::lock_guard lock(s.stop_mu);
  if (s.stopped) return;
  s.stopped = true;
  // Cancel generations first so streaming handlers finish, then stop the
  // listener (which waits for its worker threads).
  if (s.queue) s.queue->shutdown();
  s.svr.stop();
}

Status run_server(Engine& engine, const ServerOptions& options) {
  Server server(engine, options);
  AFF_RETURN_IF_ERROR(server.start());
  std::fprintf(stderr, "affinity: serving %s on http://%s:%d (OpenAI API at /v1, chat page at /)\n",
               engine.info().name.c_str(), options.host.c_str(), server.port());
  server.wait();
  return Status::ok();
}

}  // namespace aff::server
