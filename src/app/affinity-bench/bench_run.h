// The measurements of affinity-bench (CUDA builds only): builds the synthetic
// model, times prefill and decode, and renders the report as text and JSON.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "affinity/status.h"
#include "backend/cuda/runtime/device_synthetic.h"

namespace aff::bench {

// HBM read bandwidth of the H200 the roofline is stated against
// (measured by a streaming read there).
constexpr double kHbmBytesPerSecond = 4.45e12;
// Dense bf16 tensor-core rate measured by torch on the same GPU.
constexpr double kBf16FlopsPerSecond = 800e12;

struct BenchOptions {
  std::string gpu_name;
  std::string recipe;  // what --experts / --expert-types said, for the report
  int layers = 43;
  cuda::SyntheticFormat gate_up, down, dense, head;
  int expert_pool = 0;
  std::vector<int64_t> prefill, contexts;
  bool fill_by_prefill = false;
  int64_t decode_steps = 16;
  int runs = 3;
  int64_t chunk = 256;
  int64_t kv_size = 1048576, kv_commit = 8192;
  double max_seconds = 0;
  uint64_t seed = 1;
};

// Fills the formats from --experts (q2|q4|q8|mxfp4), --expert-types
// (GATEUP,DOWN; wins over --experts), --dense (fp8|q8_0) and --head (bf16|q8_0).
Status set_formats(BenchOptions& o, const std::string& experts, const std::string& expert_types,
                   const std::string& dense, const std::string& head);

struct PrefillResult {
  int64_t tokens = 0;
  bool skipped = false;
  std::string why;               // when skipped
  std::vector<double> ms;        // one per run
  double median_ms = 0;
};

struct DecodeResult {
  int64_t context = 0;
  bool skipped = false;
  std::string why;
  std::vector<double> ms_per_token;  // one per run
  double median_ms = 0;
  size_t kv_bytes_read = 0;          // cache bytes one token at this context reads
  // FNV-1a of the last run's decoded tokens and final logits' bits: two
  // settings that must compute the same numbers (a fused launch against its
  // unfused form) show the same digest.
  uint64_t digest = 0;
};

struct BenchReport {
  BenchOptions options;
  size_t model_bytes = 0;
  double build_seconds = 0;
  cuda::SyntheticBytes traffic;
  double kv_bytes_per_position = 0;  // compressed entries + indexer keys, all layers
  size_t kv_committed_bytes = 0, kv_window_bytes = 0;
  std::vector<PrefillResult> prefill;
  std::vector<DecodeResult> decode;
  bool logits_finite = true;
};

Result<BenchReport> run_bench(const BenchOptions& o);
std::string report_text(const BenchReport& r);
nlohmann::json report_json(const BenchReport& r);

}  // namespace aff::bench
