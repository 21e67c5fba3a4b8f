#ifdef AFFINITY_HAS_CUDA

#include "app/affinity-bench/bench_run.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <random>

#include <fmt/format.h>

#include "backend/cuda/cuda_forward.h"
#include "backend/cuda/gpu_state.h"
#include "backend/cuda/runtime/cuda_check.h"

namespace aff::bench {
namespace {

using Clock = std::chrono::steady_clock;

// One line per step on stderr as it happens, so a run cut short by a time
// limit still leaves its numbers behind.
template <typename... Args>
void progress(fmt::format_string<Args...> f, Args&&... args) {
  std::fprintf(stderr, "affinity-bench: %s\n", fmt::format(f, std::forward<Args>(args)...).c_str());
  std::fflush(stderr);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Milliseconds between two events recorded on either side of `work` on the
// state's stream (the forward calls synchronise before they return).
class EventTimer {
 public:
  EventTimer() {
    cudaEventCreate(&a_);
    cudaEventCreate(&b_);
  }
  ~EventTimer() {
    cudaEventDestroy(a_);
    cudaEventDestroy(b_);
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  Status start(cudaStream_t s) { return cuda::cuda_status(cudaEventRecord(a_, s), "cudaEventRecord"); }
  Result<double> stop(cudaStream_t s) {
    AFF_CUDA_RETURN_IF_ERROR(cudaEventRecord(b_, s));
    AFF_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(b_));
    float ms = 0;
    AFF_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, a_, b_));
    return double(ms);
  }

 private:
  cudaEvent_t a_ = nullptr, b_ = nullptr;
};

uint64_t fnv1a(const void* p, size_t n, uint64_t h = 0xcbf29ce484222325ull) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> dist(2, int32_t(vocab - 1));
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = dist(rng);
  return t;
}

// Compressed-cache bytes one decode token reads at `context` (f32 latents):
// the window, the selected (CSA) or all visible (HCA) entries, and every
// indexer key (the indexer scores them all).
size_t kv_read_bytes(const cuda::DeviceModel& m, int64_t context) {
  const dsv4::ModelConfig& c = m.config;
  size_t bytes = 0;
  const int64_t p = context;  // position of the decoded token
  for (const cuda::DeviceLayer& l : m.layers) {
    bytes += size_t(std::min<int64_t>(p + 1, c.sliding_window)) * size_t(c.head_dim) * 4;
    const cuda::DeviceAttention& a = l.attn;
    if (!a.compressor.present) continue;
    const int64_t entries = (p + 1) / a.compressor.ratio;
    const int64_t used = a.indexer.present ? std::min<int64_t>(entries, c.index_topk) : entries;
    bytes += size_t(used) * size_t(a.compressor.dim) * 4;
    if (a.indexer.present) bytes += size_t((p + 1) / a.indexer.compressor.ratio) * size_t(a.indexer.compressor.dim) * 4;
  }
  return bytes;
}

bool all_finite(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

class Runner {
 public:
  Runner(const BenchOptions& o, BenchReport& r) : o_(o), r_(r), t0_(Clock::now()) {}

  bool out_of_time() const {
    return o_.max_seconds > 0 && std::chrono::duration<double>(Clock::now() - t0_).count() > o_.max_seconds;
  }

  Status run() {
    const dsv4::ModelConfig cfg = cuda::v4_flash_config(43);
    cuda::SyntheticModelOptions mo;
    mo.layers = o_.layers;
    mo.expert_gate_up = o_.gate_up;
    mo.expert_down = o_.down;
    mo.dense = o_.dense;
    mo.head = o_.head;
    mo.expert_pool = o_.expert_pool;
    mo.seed = o_.seed;
    AFF_ASSIGN_OR_RETURN(r_.traffic, cuda::synthetic_decode_bytes(cfg, mo));
    const auto tb = Clock::now();
    progress("building {} layers; {:.3f} GB of weights read per decode token", o_.layers,
             double(r_.traffic.per_token()) / 1e9);
    AFF_ASSIGN_OR_RETURN(model_, cuda::make_synthetic_model(cfg, mo));
    r_.build_seconds = std::chrono::duration<double>(Clock::now() - tb).count();
    r_.model_bytes = model_->device_bytes();
    progress("built in {:.1f} s", r_.build_seconds);

    cuda::GpuStateOptions so;
    so.kv_size = o_.kv_size;
    so.kv_commit = std::min(o_.kv_commit, o_.kv_size);
    so.max_chunk = o_.chunk;
    AFF_ASSIGN_OR_RETURN(state_, cuda::make_gpu_state(*model_, so));
    r_.kv_bytes_per_position = cuda::gpu_state_kv_bytes_per_position(*model_);
    r_.kv_window_bytes = cuda::gpu_state_window_bytes(*state_);

    // Decode first: it is the headline number, and prefill at long prompts is
    // what a time budget cuts.
    for (int64_t c : o_.contexts) r_.decode.push_back(decode(c));
    for (int64_t n : o_.prefill) r_.prefill.push_back(prefill(n));
    r_.kv_committed_bytes = cuda::gpu_state_committed_kv_bytes(*state_);
    return Status::ok();
  }

 private:
  // Ok, or the reason a measurement of positions [0, end) cannot run.
  std::string cannot_run(int64_t end) const {
    if (end > o_.kv_size) return fmt::format("needs {} positions, --kv-size is {}", end, o_.kv_size);
    if (out_of_time()) return fmt::format("--max-seconds {} reached", o_.max_seconds);
    if (o_.max_seconds > 0 && prefill_tok_s_ > 0) {
      const double left = o_.max_seconds - std::chrono::duration<double>(Clock::now() - t0_).count();
      const double need = double(end) / prefill_tok_s_;
      if (need > left)
        return fmt::format("a prefill of {} tokens would take ~{:.0f} s at the rate measured so far, past --max-seconds",
                           end, need);
    }
    return {};
  }

  PrefillResult prefill(int64_t n) {
    PrefillResult p;
    p.tokens = n;
    if (n < 1) return p.skipped = true, p.why = "no tokens", p;
    const std::vector<int32_t> toks = random_tokens(n, model_->config.vocab_size, o_.seed + uint64_t(n));
    std::vector<float> logits;
    for (int run = 0; run < o_.runs; ++run) {
      if (std::string why = cannot_run(n); !why.empty()) {
        if (p.ms.empty()) p.skipped = true, p.why = why;
        break;
      }
      const Status st = prefill_once(toks, logits);
      if (!st.is_ok()) {
        p.skipped = true, p.why = st.message();
        break;
      }
      p.ms.push_back(last_ms_);
      progress("prefill {} tokens: {:.1f} ms ({:.1f} tok/s)", n, last_ms_, double(n) / last_ms_ * 1e3);
      prefill_tok_s_ = double(n) / (last_ms_ * 1e-3);
      r_.logits_finite = r_.logits_finite && all_finite(logits);
    }
    p.median_ms = median(p.ms);
    return p;
  }

  Status prefill_once(const std::vector<int32_t>& toks, std::vector<float>& logits) {
    cuda::gpu_state_reset(*state_);
    AFF_RETURN_IF_ERROR(cuda::gpu_state_reserve(*state_, int64_t(toks.size())));
    EventTimer t;
    AFF_RETURN_IF_ERROR(t.start(state_->stream.get()));
    AFF_RETURN_IF_ERROR(cuda::gpu_forward(*model_, *state_, toks, /*all_positions=*/false, logits));
    AFF_ASSIGN_OR_RETURN(last_ms_, t.stop(state_->stream.get()));
    return Status::ok();
  }

  DecodeResult decode(int64_t context) {
    DecodeResult d;
    d.context = context;
    d.kv_bytes_read = kv_read_bytes(*model_, context);
    const int64_t end = context + o_.decode_steps + 2;  // + the warm-up and the logits check
    if (std::string why = cannot_run(end); !why.empty()) return d.skipped = true, d.why = why, d;
    const Status st = decode_runs(context, d);
    if (!st.is_ok()) d.skipped = true, d.why = st.message();
    d.median_ms = median(d.ms_per_token);
    return d;
  }

  // Every run starts again at `context` (same cache contents), so the runs
  // time the same positions; the first step of each run is not timed (the
  // first one ever captures the decode graph).
  Status decode_runs(int64_t context, DecodeResult& d) {
    AFF_RETURN_IF_ERROR(cuda::gpu_state_reserve(*state_, context + o_.decode_steps + 2));
    std::vector<int32_t> prompt;
    if (o_.fill_by_prefill && context > 0)
      prompt = random_tokens(context, model_->config.vocab_size, o_.seed ^ uint64_t(context));
    std::vector<float> logits;
    for (int run = 0; run < o_.runs; ++run) {
      if (run > 0 && out_of_time()) break;
      cuda::gpu_state_reset(*state_);
      progress("decode at context {}: run {}", context, run + 1);
      if (!prompt.empty()) {
        AFF_RETURN_IF_ERROR(cuda::gpu_forward(*model_, *state_, prompt, false, logits));
      } else {
        AFF_RETURN_IF_ERROR(cuda::synthetic_fill_state(*state_, context, o_.seed + uint64_t(context)));
      }
      int32_t tok = 2 + int32_t(context % 1000);
      AFF_ASSIGN_OR_RETURN(tok, cuda::gpu_forward_greedy(*model_, *state_, {&tok, 1}));
      std::vector<int32_t> decoded;
      decoded.reserve(size_t(o_.decode_steps));
      EventTimer t;
      AFF_RETURN_IF_ERROR(t.start(state_->stream.get()));
      for (int64_t i = 0; i < o_.decode_steps; ++i) {
        AFF_ASSIGN_OR_RETURN(tok, cuda::gpu_forward_greedy(*model_, *state_, {&tok, 1}));
        if (tok < 0 || tok >= model_->config.vocab_size)
          return internal_error(fmt::format("decode produced token id {} outside the vocabulary", tok));
        decoded.push_back(tok);
      }
      AFF_ASSIGN_OR_RETURN(const double ms, t.stop(state_->stream.get()));
      d.ms_per_token.push_back(ms / double(o_.decode_steps));
      progress("decode at context {}: {:.3f} ms/token", context, d.ms_per_token.back());
      // One more step, untimed, brings the logits back to check they are finite.
      AFF_RETURN_IF_ERROR(cuda::gpu_forward(*model_, *state_, {&tok, 1}, false, logits));
      r_.logits_finite = r_.logits_finite && all_finite(logits);
      d.digest = fnv1a(logits.data(), logits.size() * sizeof(float), fnv1a(decoded.data(), decoded.size() * 4));
    }
    return Status::ok();
  }

  const BenchOptions& o_;
  BenchReport& r_;
  Clock::time_point t0_;
  std::unique_ptr<cuda::DeviceModel> model_;
  std::unique_ptr<cuda::GpuState> state_;
  double last_ms_ = 0;
  double prefill_tok_s_ = 0;  // latest measured prefill rate (for the time budget)
};

std::string gb(double bytes) { return fmt::format("{:.2f} GB", bytes / 1e9); }

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

}  // namespace

Status set_formats(BenchOptions& o, const std::string& experts, const std::string& expert_types,
                   const std::string& dense, const std::string& head) {
  using cuda::parse_synthetic_format;
  if (!expert_types.empty()) {
    const size_t comma = expert_types.find(',');
    if (comma == std::string::npos) return invalid_argument("--expert-types: expected GATEUP,DOWN");
    AFF_ASSIGN_OR_RETURN(o.gate_up, parse_synthetic_format(expert_types.substr(0, comma)));
    AFF_ASSIGN_OR_RETURN(o.down, parse_synthetic_format(expert_types.substr(comma + 1)));
    o.recipe = expert_types;
  } else {
    std::string gu, dn;
    if (experts == "q2") gu = "IQ2_XXS", dn = "Q2_K";
    else if (experts == "q2k") gu = "Q2_K", dn = "Q3_K";
    else if (experts == "q4") gu = dn = "Q4_K";
    else if (experts == "q8") gu = dn = "Q8_0";
    else if (experts == "mxfp4") gu = dn = "mxfp4";
    else return invalid_argument("--experts: expected q2, q2k, q4, q8 or mxfp4, got '" + experts + "'");
    AFF_ASSIGN_OR_RETURN(o.gate_up, parse_synthetic_format(gu));
    AFF_ASSIGN_OR_RETURN(o.down, parse_synthetic_format(dn));
    o.recipe = experts;
  }
  if (dense == "fp8") o.dense = {cuda::SyntheticFormat::Kind::kFP8Block, ""};
  else if (dense == "q8_0" || dense == "Q8_0") o.dense = {cuda::SyntheticFormat::Kind::kGgml, "Q8_0"};
  else return invalid_argument("--dense: expected fp8 or q8_0, got '" + dense + "'");
  if (head == "bf16" || head == "BF16") o.head = {cuda::SyntheticFormat::Kind::kBF16, ""};
  else if (head == "q8_0" || head == "Q8_0") o.head = {cuda::SyntheticFormat::Kind::kGgml, "Q8_0"};
  else return invalid_argument("--head: expected bf16 or q8_0, got '" + head + "'");
  return Status::ok();
}

Result<BenchReport> run_bench(const BenchOptions& o) {
  BenchReport r;
  r.options = o;
  Runner runner(o, r);
  AFF_RETURN_IF_ERROR(runner.run());
  return r;
}

std::string report_text(const BenchReport& r) {
  const BenchOptions& o = r.options;
  const cuda::SyntheticBytes& t = r.traffic;
  const double per_tok = double(t.per_token());
  const double floor_ms = per_tok / kHbmBytesPerSecond * 1e3;
  std::string s;
  s += fmt::format("affinity-bench {} on {}, {}\n", AFFINITY_VERSION, o.gpu_name, utc_now());
  s += fmt::format("model: V4-Flash geometry, {} layers, experts {} ({}/{}, {:.3f} bpw), dense {}, head {}{}; {} on "
                   "the device, built in {:.1f} s\n",
                   o.layers, o.recipe, o.gate_up.name(), o.down.name(),
                   (2 * o.gate_up.bits_per_weight() + o.down.bits_per_weight()) / 3, o.dense.name(), o.head.name(),
                   o.expert_pool ? fmt::format(", {} physical experts per layer", o.expert_pool) : "",
                   gb(double(r.model_bytes)), r.build_seconds);
  s += fmt::format("weights read per decode token: {} (embedding row {} B, dense {}, routed {}x{} experts {}, head {}); "
                   "floor {:.3f} ms = {:.0f} tok/s at {:.2f} TB/s\n",
                   gb(per_tok), t.embed_row, gb(double(t.dense)), t.routed_per_token, t.layers, gb(double(t.routed())),
                   gb(double(t.head)), floor_ms, 1e3 / floor_ms, kHbmBytesPerSecond / 1e12);
  s += fmt::format("KV: {:.0f} B per position (f32 compressed entries + indexer keys), window rings {}; "
                   "--kv-size {}, committed at the end {}\n",
                   r.kv_bytes_per_position, gb(double(r.kv_window_bytes)), o.kv_size, gb(double(r.kv_committed_bytes)));
  s += fmt::format("\nprefill (median of up to {} runs; FLOP floor = 2 x weight MACs / {:.0f} TFLOP/s)\n", o.runs,
                   kBf16FlopsPerSecond / 1e12);
  s += fmt::format("{:>8} {:>12} {:>10} {:>12} {:>5}\n", "tokens", "ms", "tok/s", "% FLOP floor", "runs");
  for (const PrefillResult& p : r.prefill) {
    if (p.skipped) {
      s += fmt::format("{:>8} skipped: {}\n", p.tokens, p.why);
      continue;
    }
    const double flop_floor_ms = 2.0 * double(t.macs_per_token()) * double(p.tokens) / kBf16FlopsPerSecond * 1e3;
    s += fmt::format("{:>8} {:>12.1f} {:>10.1f} {:>11.2f}% {:>5}\n", p.tokens, p.median_ms,
                     double(p.tokens) / p.median_ms * 1e3, 100 * flop_floor_ms / p.median_ms, p.ms.size());
  }
  s += fmt::format("\ndecode (context filled by {}; {} tokens per run, median of up to {} runs)\n",
                   o.fill_by_prefill ? "prefill" : "synthetic cache contents with the position set", o.decode_steps,
                   o.runs);
  s += fmt::format("{:>8} {:>10} {:>9} {:>14} {:>14} {:>5} {:>17}\n", "context", "ms/token", "tok/s",
                   "% HBM (weights)", "% HBM (+KV)", "runs", "digest");
  for (const DecodeResult& d : r.decode) {
    if (d.skipped) {
      s += fmt::format("{:>8} skipped: {}\n", d.context, d.why);
      continue;
    }
    const double bw = per_tok / (d.median_ms * 1e-3);
    const double bw_kv = (per_tok + double(d.kv_bytes_read)) / (d.median_ms * 1e-3);
    s += fmt::format("{:>8} {:>10.3f} {:>9.2f} {:>13.2f}% {:>13.2f}% {:>5} {:>17x}\n", d.context, d.median_ms,
                     1e3 / d.median_ms, 100 * bw / kHbmBytesPerSecond, 100 * bw_kv / kHbmBytesPerSecond,
                     d.ms_per_token.size(), d.digest);
  }
  s += fmt::format("\nlogits finite: {}\n", r.logits_finite ? "yes" : "NO");
  return s;
}

nlohmann::json report_json(const BenchReport& r) {
  const BenchOptions& o = r.options;
  const cuda::SyntheticBytes& t = r.traffic;
  nlohmann::json j;
  j["version"] = AFFINITY_VERSION;
  j["date"] = utc_now();
  j["gpu"] = o.gpu_name;
  j["model"] = {{"geometry", "DeepSeek-V4-Flash"},
                {"layers", o.layers},
                {"experts", o.recipe},
                {"expert_gate_up", o.gate_up.name()},
                {"expert_down", o.down.name()},
                {"dense", o.dense.name()}, {"head", o.head.name()},
                {"expert_pool", o.expert_pool},
                {"device_bytes", r.model_bytes},
                {"build_seconds", r.build_seconds}};
  j["decode_bytes_per_token"] = {{"total", t.per_token()},  {"embedding_row", t.embed_row}, {"dense", t.dense},
                                 {"routed", t.routed()},     {"one_expert", t.expert},      {"head", t.head},
                                 {"macs", t.macs_per_token()}};
  j["hbm_bytes_per_second"] = kHbmBytesPerSecond;
  j["decode_floor_ms"] = double(t.per_token()) / kHbmBytesPerSecond * 1e3;
  j["kv"] = {{"bytes_per_position", r.kv_bytes_per_position},
             {"window_bytes", r.kv_window_bytes},
             {"kv_size", o.kv_size},
             {"kv_commit", o.kv_commit},
             {"committed_bytes_at_end", r.kv_committed_bytes}};
  nlohmann::json pf = nlohmann::json::array();
  for (const PrefillResult& p : r.prefill) {
    nlohmann::json e = {{"tokens", p.tokens}, {"skipped", p.skipped}};
    if (p.skipped) e["why"] = p.why;
    else e.update({{"ms", p.ms}, {"median_ms", p.median_ms}, {"tok_per_s", double(p.tokens) / p.median_ms * 1e3}});
    pf.push_back(e);
  }
  j["prefill"] = pf;
  nlohmann::json dc = nlohmann::json::array();
  for (const DecodeResult& d : r.decode) {
    nlohmann::json e = {{"context", d.context}, {"skipped", d.skipped}, {"kv_bytes_read", d.kv_bytes_read}};
    if (d.skipped) {
      e["why"] = d.why;
    } else {
      e.update({{"ms_per_token", d.ms_per_token},
                {"median_ms_per_token", d.median_ms},
                {"tok_per_s", 1e3 / d.median_ms},
                {"digest", fmt::format("{:x}", d.digest)},
                {"hbm_fraction_weights", double(t.per_token()) / (d.median_ms * 1e-3) / kHbmBytesPerSecond}});
    }
    dc.push_back(e);
  }
  j["decode"] = dc;
  j["decode_fill"] = o.fill_by_prefill ? "prefill" : "synthetic";
  j["decode_steps_per_run"] = o.decode_steps;
  j["logits_finite"] = r.logits_finite;
  return j;
}

}  // namespace aff::bench

#endif  // AFFINITY_HAS_CUDA
