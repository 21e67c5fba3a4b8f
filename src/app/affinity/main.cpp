// affinity: generate text with a DeepSeek-V4 checkpoint from the command line.
// Exit status: 0 success, 1 the model or an input could not be used, 2 usage
// error. Every flag is declared in src/core/options.cpp.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "affinity/engine.h"
#include "backend/cpu/linear_fast.h"
#include "core/options.h"
#include "format/npy.h"
#include "runtime/perplexity.h"
#include "runtime/route_stats.h"
#include "runtime/sampler.h"
#include "server/http_server.h"
#include "tokenizer/tokenizer.h"

namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int usage_error(const std::string& message) {
  std::fprintf(stderr, "affinity: error: %s\nRun 'affinity --help' for the options.\n", message.c_str());
  return kExitUsage;
}

int failure(const std::string& message) {
  std::fprintf(stderr, "affinity: error: %s\n", message.c_str());
  return kExitFailure;
}

void write_out(const std::string& s) {
  if (s.empty()) return;
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
}

std::string join_ids(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += fmt::format("{}{}", i ? "," : "", ids[i]);
  return s;
}

std::string rate(size_t n, double s) { return s > 0 ? fmt::format("{:.2f}", double(n) / s) : "inf"; }

// The prompt as token ids: --tokens verbatim; text gets BOS in front (unless
// --no-bos or it already starts with BOS), special-token strings recognised.
aff::Result<std::vector<int32_t>> prompt_ids(const aff::core::Options& o, const std::string& text,
                                             const aff::Engine& engine) {
  if (o.was_given("--tokens")) return o.tokens;
  std::vector<int32_t> ids = engine.tokenizer().encode(text, /*parse_special=*/true);
  if (!o.no_bos && (ids.empty() || ids.front() != engine.info().bos_id)) ids.insert(ids.begin(), engine.info().bos_id);
  return ids;
}

void print_top_logits(size_t step, std::span<const float> logits, int k, int32_t chosen, const aff::Tokenizer& tok) {
  std::string line = fmt::format("step {} -> {}:", step, chosen);
  for (const auto& [id, v] : aff::runtime::top_logits(logits, k)) {
    std::string piece = tok.token_bytes(id);
    for (char& c : piece) {
      if (static_cast<unsigned char>(c) < 0x20) c = ' ';
    }
    line += fmt::format(" {}={:.4f} {:?}", id, v, piece);
  }
  std::fprintf(stderr, "%s\n", line.c_str());
}

int write_logits(const aff::core::Options& o, aff::Engine& engine, const std::vector<int32_t>& prompt) {
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), o.force_tokens.begin(), o.force_tokens.end());
  if (all.empty()) return failure("--logits-out needs at least one token");
  if (int64_t(all.size()) > engine.info().max_context) {
    return failure(fmt::format("{} tokens exceed the context of {} positions (--ctx-size)", all.size(),
                               engine.info().max_context));
  }
  auto session = engine.new_session(int64_t(all.size()));
  std::vector<float> logits;
  const auto t0 = Clock::now();
  aff::Status st = session->eval(all, &logits);
  if (!st.is_ok()) return failure(st.message());
  const double dt = seconds_since(t0);
  const int64_t shape[2] = {int64_t(all.size()), engine.info().vocab_size};
  st = aff::format::write_npy_f32(o.logits_out, shape, logits);
  if (!st.is_ok()) return failure(st.message());
  std::fprintf(stderr, "affinity: wrote %s [%lld, %lld]; %zu positions in %.3f s (%s tok/s)\n", o.logits_out.c_str(),
               static_cast<long long>(shape[0]), static_cast<long long>(shape[1]), all.size(), dt,
               rate(all.size(), dt).c_str());
  return kExitOk;
}

int generate(const aff::core::Options& o, aff::Engine& engine, const std::vector<int32_t>& prompt,
             const std::string& echo_text) {
  const aff::ModelInfo& info = engine.info();
  if (prompt.empty()) return failure("the prompt is empty (nothing to condition on); drop --no-bos or give tokens");
  // --force-tokens alone decodes exactly those ids; with -n, forced ids come first.
  size_t steps = size_t(o.n_predict);
  if (!o.force_tokens.empty() && !o.was_given("--n-predict")) steps = o.force_tokens.size();
  if (int64_t(prompt.size()) > info.max_context) {
    return failure(fmt::format("the prompt's {} tokens exceed the context of {} positions (--ctx-size)",
                               prompt.size(), info.max_context));
  }
  if (int64_t(prompt.size() + steps) > info.max_context + 1) {
    steps = size_t(info.max_context + 1 - int64_t(prompt.size()));
    std::fprintf(stderr, "affinity: generation limited to %zu tokens by the context of %lld positions\n", steps,
                 static_cast<long long>(info.max_context));
  }

  aff::SamplingParams sp;
  sp.temperature = o.temp;
  sp.top_k = o.top_k;
  sp.top_p = o.top_p;
  sp.min_p = o.min_p;
  sp.seed = o.seed >= 0 ? uint64_t(o.seed) : uint64_t(Clock::now().time_since_epoch().count());
  if (sp.temperature > 0.0f) std::fprintf(stderr, "affinity: seed %llu\n", static_cast<unsigned long long>(sp.seed));
  aff::Sampler sampler(sp);

  auto session = engine.new_session(int64_t(prompt.size() + steps));
  if (!o.no_echo) {
    if (o.was_given("--tokens")) {
      std::vector<int32_t> known;
      for (int32_t id : prompt) {
        if (id < engine.tokenizer().vocab_size()) known.push_back(id);
      }
      write_out(engine.tokenizer().decode(known));
    } else {
      write_out(echo_text);
    }
  }

  const auto t_prefill = Clock::now();
  aff::Status st = session->eval(prompt);
  if (!st.is_ok()) return failure(st.message());
  const double prefill_s = seconds_since(t_prefill);

  aff::StreamingDecoder decoder(engine.tokenizer());
  size_t generated = 0, decoded = 0;
  bool wrote = false;
  const auto t_decode = Clock::now();
  for (size_t i = 0; i < steps; ++i) {
    const bool forced = i < o.force_tokens.size();
    const int32_t next = forced ? o.force_tokens[i] : sampler.sample(session->last_logits());
    if (o.dump_logits > 0) print_top_logits(i, session->last_logits(), o.dump_logits, next, engine.tokenizer());
    if (!forced && next == info.eos_id && !o.ignore_eos) break;
    ++generated;
    // A padded vocabulary can hold ids the tokenizer has no text for.
    const std::string piece = next < engine.tokenizer().vocab_size() ? decoder.push(next) : std::string();
    wrote = wrote || !piece.empty();
    write_out(piece);
    if (i + 1 == steps) break;  // the last token needs no forward pass
    const int32_t one[1] = {next};
    st = session->eval(one);
    if (!st.is_ok()) {
      write_out(decoder.flush());
      return failure(st.message());
    }
    ++decoded;
  }
  const double decode_s = seconds_since(t_decode);
  write_out(decoder.flush());
  if (isatty(fileno(stdout)) && (wrote || !o.no_echo)) write_out("\n");

  // The decode rate counts forward steps: the last generated token needs none.
  std::fprintf(stderr,
               "affinity: prefill %zu tokens in %.3f s (%s tok/s); generated %zu tokens, %zu decode steps in %.3f s "
               "(%s tok/s)\n",
               prompt.size(), prefill_s, rate(prompt.size(), prefill_s).c_str(), generated, decoded, decode_s,
               rate(decoded, decode_s).c_str());
  return kExitOk;
}

aff::Result<std::vector<int32_t>> read_text_ids(const std::string& path, const aff::Engine& engine) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return aff::not_found(fmt::format("cannot read text file '{}'", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  // The text's own special-token strings (e.g. a BOS per document) count; none is added.
  return engine.tokenizer().encode(ss.str(), /*parse_special=*/true);
}

// --perplexity and --route-stats: one pass over the text when both name the same file.
int evaluate(const aff::core::Options& o, aff::Engine& engine) {
  const aff::dsv4::LoadedModel* model = engine.reference_model();
  if (model == nullptr) return failure("--perplexity and --route-stats need the CPU reference model");
  if (o.ppl_context > engine.info().max_context) {
    return failure(fmt::format("--ppl-context {} exceeds the context of {} positions (--ctx-size)", o.ppl_context,
                               engine.info().max_context));
  }
  struct Pass {
    std::string file;
    bool ppl = false, routes = false;
  };
  std::vector<Pass> passes;
  if (!o.perplexity.empty()) passes.push_back({o.perplexity, true, o.route_stats == o.perplexity});
  if (!o.route_stats.empty() && o.route_stats != o.perplexity) passes.push_back({o.route_stats, false, true});

  nlohmann::json json = nlohmann::json::object();
  for (const Pass& pass : passes) {
    auto ids = read_text_ids(pass.file, engine);
    if (!ids.is_ok()) return failure(ids.status().message());
    aff::runtime::PerplexityOptions po;
    po.context = o.ppl_context;
    po.bos_each_chunk = !o.no_bos;
    po.bos_id = engine.info().bos_id;
    po.batch = o.prefill_chunk_size;
    po.score = pass.ppl;
    po.max_layers = o.max_layers > 0 ? o.max_layers : -1;
    po.no_routed_experts = o.no_routed_experts;
    aff::runtime::RouteStatsRecorder recorder(model->config);
    if (pass.routes) po.route_observer = &recorder.observer();
    const bool tty = isatty(fileno(stderr));
    po.progress = [&](int64_t done, int64_t total) {
      if (tty) std::fprintf(stderr, "\raffinity: chunk %lld/%lld", static_cast<long long>(done), static_cast<long long>(total));
    };
    auto rep = aff::runtime::evaluate_perplexity(*model, ids.value(), po);
    if (tty) std::fprintf(stderr, "\n");
    if (!rep.is_ok()) return failure(fmt::format("{}: {}", pass.file, rep.status().message()));
    const aff::runtime::PerplexityReport& r = rep.value();
    std::fprintf(stderr, "affinity: %s: %lld positions in %.2f s (%s tok/s)\n", pass.file.c_str(),
                 static_cast<long long>(r.positions), r.seconds, rate(size_t(r.positions), r.seconds).c_str());
    if (pass.ppl) {
      write_out(aff::runtime::perplexity_table(r));
      json["perplexity"] = aff::runtime::perplexity_json(r);
      json["perplexity"]["file"] = pass.file;
    }
    if (pass.routes) {
      const auto layers = recorder.layers();
      write_out(aff::runtime::route_stats_table(layers));
      json["route_stats"] = {{"file", pass.file}, {"layers", aff::runtime::route_stats_json(layers)}};
    }
  }
  if (!o.json_out.empty()) {
    json["model"] = engine.info().source;
    std::ofstream out(o.json_out, std::ios::binary);
    out << json.dump(2) << "\n";
    if (!out) return failure(fmt::format("cannot write '{}'", o.json_out));
  }
  return kExitOk;
}

int serve(const aff::core::Options& o, aff::Engine& engine) {
  aff::server::ServerOptions so;
  so.host = o.host;
  so.port = o.port;
  so.max_tokens_floor = o.max_tokens_floor;
  so.max_sessions = o.parallel;
  const aff::Status st = aff::server::run_server(engine, so);
  if (!st.is_ok()) return failure(st.message());
  return kExitOk;
}

int run(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  auto parsed = aff::core::parse_options(args);
  if (!parsed.is_ok()) return usage_error(parsed.status().message());
  const aff::core::Options& o = parsed.value();

  if (o.help) {
    write_out(aff::core::options_help("affinity"));
    return kExitOk;
  }
  if (o.help_md) {
    write_out(aff::core::options_markdown());
    return kExitOk;
  }
  if (o.version) {
    write_out(fmt::format("affinity {}\n", AFFINITY_VERSION));
    return kExitOk;
  }
  const bool has_prompt = o.was_given("--prompt") || o.was_given("--prompt-file") || o.was_given("--tokens");

  std::string text = o.prompt;
  if (o.was_given("--prompt-file")) {
    std::ifstream in(o.prompt_file, std::ios::binary);
    if (!in) return failure(fmt::format("cannot read prompt file '{}'", o.prompt_file));
    std::ostringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }

  aff::EngineOptions eo;
  eo.model_path = o.model;
  eo.tokenizer_path = o.tokenizer;
  eo.threads = o.threads;
  eo.ctx_size = o.ctx_size;
  eo.prefill_chunk_size = o.prefill_chunk_size;
  eo.max_layers = o.max_layers > 0 ? o.max_layers : -1;
  eo.no_routed_experts = o.no_routed_experts;
  eo.gpu = o.gpu;
  eo.kv_size = o.kv_size;
  eo.kv_commit = o.kv_commit;
  eo.gpu_chunk = o.gpu_chunk;
  aff::cpu::set_cpu_lane_enabled(o.cpu_lane != 0);
  const auto t_load = Clock::now();
  auto engine = aff::Engine::load(eo);
  if (!engine.is_ok()) return failure(engine.status().message());
  const aff::ModelInfo& info = engine.value()->info();
  std::fprintf(stderr, "affinity: loaded %s (%s): vocab %lld, context %lld, in %.2f s\n", info.name.c_str(),
               info.source.c_str(), static_cast<long long>(info.vocab_size),
               static_cast<long long>(info.max_context), seconds_since(t_load));
  std::fprintf(stderr, "affinity: running on %s\n", info.backend.c_str());
  if (!info.backend_note.empty()) std::fprintf(stderr, "affinity: %s\n", info.backend_note.c_str());

  if (o.was_given("--perplexity") || o.was_given("--route-stats")) return evaluate(o, *engine.value());
  if (!has_prompt) return serve(o, *engine.value());

  auto prompt = prompt_ids(o, text, *engine.value());
  if (!prompt.is_ok()) return failure(prompt.status().message());
  const std::vector<int32_t>* lists[] = {&prompt.value(), &o.force_tokens};
  for (const std::vector<int32_t>* list : lists) {
    for (int32_t id : *list) {
      if (id >= info.vocab_size) {
        return failure(fmt::format("token id {} is outside the model's vocabulary [0, {})", id, info.vocab_size));
      }
    }
  }
  if (o.dump_tokens) {
    write_out(join_ids(prompt.value()) + "\n");
    return kExitOk;
  }
  if (!o.logits_out.empty()) return write_logits(o, *engine.value(), prompt.value());
  return generate(o, *engine.value(), prompt.value(), text);
}

}  // namespace

int main(int argc, char** argv) {
  // Library code reports errors as Status; this is the last line of defence
  // (e.g. allocation failure) so the process still exits with a message.
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    return failure(fmt::format("unexpected failure: {}", e.what()));
  }
}
