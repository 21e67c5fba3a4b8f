// affinity-bench: times the GPU forward pass at DeepSeek-V4-Flash's full
// geometry on a random-weight model built directly in device memory (no
// checkpoint, no host copy of ~100 GB): prefill tok/s at several prompt
// lengths, decode ms/token at several contexts, and the weight bytes a decode
// token reads, as a fraction of the HBM roofline. The values are noise, so
// nothing here checks correctness (tests/gpu and aff-gpucheck do); the bench
// only checks that the logits stay finite.
//   affinity-bench [--layers 43] [--experts q2] [--prefill 1024,8192] [--contexts 0,4096,32768] [--json F]
// Exit status: 0 done, 1 the GPU could not run it, 2 usage error, 3 no CUDA.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "affinity/engine.h"
#include "backend/device_probe.h"
#include "core/options.h"

#ifdef AFFINITY_HAS_CUDA
#include "app/affinity-bench/bench_run.h"
#endif

namespace {

struct Flag {
  std::string_view name, metavar, help;
};

// The one list of flags: parsing accepts exactly these, --help prints them.
constexpr Flag kFlags[] = {
    {"--layers", "N", "layers of the model, 1..43; default 43"},
    {"--experts", "RECIPE", "routed expert storage: q2 (IQ2_XXS gate/up + Q2_K down, 2.25 bpw, as aff-quantize), "
                            "q2k (Q2_K gate/up + Q3_K down, 2.9 bpw), q4 (Q4_K), q8 (Q8_0), mxfp4 (the checkpoint's FP4); "
                            "default q2"},
    {"--expert-types", "GATEUP,DOWN", "explicit ggml (or fp8/mxfp4/bf16) types of w1/w3 and w2, e.g. IQ2_XXS,Q2_K"},
    {"--dense", "FMT", "attention and shared-expert storage: fp8 (E4M3 + 128x128 E8M0 scales) or q8_0; default fp8"},
    {"--head", "FMT", "output head storage: bf16 (the official checkpoint) or q8_0 (aff-quantize's containers); "
                      "default bf16"},
    {"--expert-pool", "N", "physical experts per layer shared round-robin by the 256 slots (for formats too large "
                           "for the GPU); default 0 = one per slot"},
    {"--prefill", "LIST", "prompt lengths to time; default 1024,8192,32768; 'none' skips"},
    {"--contexts", "LIST", "contexts to time decode at; default 0,4096,32768; 'none' skips"},
    {"--fill", "HOW", "how decode contexts are reached: synthetic (random cache contents, position set) or "
                      "prefill (run the prompt); default synthetic"},
    {"--decode-steps", "N", "tokens decoded per run; default 16"},
    {"--runs", "N", "runs per measurement (the median is reported); default 3"},
    {"--chunk", "N", "prefill tokens per forward call (the state's chunk); default 4096, as affinity's --gpu-chunk"},
    {"--kv-size", "N", "positions of KV address space; default 1048576"},
    {"--kv-commit", "N", "positions of KV backed at start (grows on demand); default 8192"},
    {"--max-seconds", "S", "skip measurements that would start after S seconds; default 0 = no limit"},
    {"--seed", "N", "weights and tokens seed; default 1"},
    {"--json", "FILE", "also write the results as JSON"},
    {"--help", "", "this text"},
};

void print_help(std::FILE* f) {
  std::fprintf(f, "usage: affinity-bench [options]\n\n");
  for (const auto& fl : kFlags) {
    const std::string left = fmt::format("{} {}", fl.name, fl.metavar);
    std::fprintf(f, "  %-28s %s\n", left.c_str(), std::string(fl.help).c_str());
  }
}

int usage_error(const std::string& msg) {
  std::fprintf(stderr, "affinity-bench: %s\n\n", msg.c_str());
  print_help(stderr);
  return 2;
}

// "1024,8192" -> {1024, 8192}; "none" -> {}.
bool parse_list(const std::string& s, std::vector<int64_t>& out) {
  out.clear();
  if (s == "none") return true;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t comma = s.find(',', start);
    const std::string item = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    int64_t v = 0;
    if (!aff::core::parse_int64(item, v) || v < 0) return false;
    out.push_back(v);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return !out.empty();
}

}  // namespace

int main(int argc, char** argv) {
#ifdef AFFINITY_HAS_CUDA
  aff::bench::BenchOptions o;
#endif
  std::string experts = "q2", expert_types, dense = "fp8", head = "bf16", json_path, fill = "synthetic";
  std::vector<int64_t> prefill = {1024, 8192, 32768}, contexts = {0, 4096, 32768};
  // The prefill chunk defaults to the engine's (affinity --gpu-chunk), so the bench measures what it runs.
  int64_t layers = 43, pool = 0, steps = 16, runs = 3, chunk = aff::EngineOptions{}.gpu_chunk, kv_size = 1048576,
          kv_commit = 8192, seed = 1;
  double max_seconds = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      print_help(stdout);
      return 0;
    }
    bool known = false;
    for (const auto& f : kFlags) known = known || (a == f.name && !f.metavar.empty());
    if (!known) return usage_error(fmt::format("unknown argument '{}'", a));
    if (i + 1 >= argc) return usage_error(fmt::format("{} needs a value", a));
    const std::string v = argv[++i];
    auto integer = [&](int64_t& out, int64_t lo, int64_t hi) {
      return aff::core::parse_int64(v, out) && out >= lo && out <= hi;
    };
    bool ok = true;
    if (a == "--layers") ok = integer(layers, 1, 43);
    else if (a == "--experts") experts = v;
    else if (a == "--expert-types") expert_types = v;
    else if (a == "--dense") dense = v;
    else if (a == "--head") head = v;
    else if (a == "--expert-pool") ok = integer(pool, 0, 256);
    else if (a == "--prefill") ok = parse_list(v, prefill);
    else if (a == "--contexts") ok = parse_list(v, contexts);
    else if (a == "--fill") ok = (fill = v) == "synthetic" || v == "prefill";
    else if (a == "--decode-steps") ok = integer(steps, 1, 1 << 20);
    else if (a == "--runs") ok = integer(runs, 1, 1000);
    else if (a == "--chunk") ok = integer(chunk, 1, 1 << 16);
    else if (a == "--kv-size") ok = integer(kv_size, 1, int64_t(1) << 32);
    else if (a == "--kv-commit") ok = integer(kv_commit, 0, int64_t(1) << 32);
    else if (a == "--max-seconds") ok = aff::core::parse_double(v, max_seconds) && max_seconds >= 0;
    else if (a == "--seed") ok = integer(seed, 0, INT64_MAX);
    else if (a == "--json") json_path = v;
    if (!ok) return usage_error(fmt::format("{}: invalid value '{}'", a, v));
  }
#ifndef AFFINITY_HAS_CUDA
  std::fprintf(stderr, "affinity-bench: this build has no CUDA backend (configure with a CUDA toolkit)\n");
  return 3;
#else
  std::string probe_error;
  const auto gpus = aff::probe_gpus(&probe_error);
  if (gpus.empty()) {
    std::fprintf(stderr, "affinity-bench: no CUDA device visible%s%s\n", probe_error.empty() ? "" : ": ",
                 probe_error.c_str());
    return 3;
  }
  o.gpu_name = gpus[0].name;
  o.layers = int(layers);
  o.expert_pool = int(pool);
  o.prefill = prefill;
  o.contexts = contexts;
  o.fill_by_prefill = fill == "prefill";
  o.decode_steps = steps;
  o.runs = int(runs);
  o.chunk = chunk;
  o.kv_size = kv_size;
  o.kv_commit = kv_commit;
  o.max_seconds = max_seconds;
  o.seed = uint64_t(seed);
  auto st = aff::bench::set_formats(o, experts, expert_types, dense, head);
  if (!st.is_ok()) return usage_error(st.message());
  auto report = aff::bench::run_bench(o);
  if (!report.is_ok()) {
    std::fprintf(stderr, "affinity-bench: %s\n", report.status().message().c_str());
    return 1;
  }
  std::fputs(aff::bench::report_text(*report).c_str(), stdout);
  if (!json_path.empty()) {
    std::ofstream out(json_path, std::ios::binary);
    out << aff::bench::report_json(*report).dump(2) << "\n";
    if (!out) {
      std::fprintf(stderr, "affinity-bench: cannot write '%s'\n", json_path.c_str());
      return 1;
    }
  }
  return report->logits_finite ? 0 : 1;
#endif
}
