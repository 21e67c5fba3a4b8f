// What a model file or directory holds, for aff-info: architecture, storage
// per type, the routed experts' footprint, how a GPU budget would split it, and
// every problem found. Works on checkpoint directories and GGUF containers.
//
// Placement rule (what plan_placement computes and aff-info prints):
//   VRAM holds, in this order, everything that is not a routed expert (dense
//   weights: embedding, attention, shared experts, router, norms, head, MTP),
//   then the KV state for `ctx` positions (kv_state_bytes), then whole routed
//   experts (an expert = its gate, up and down projections) taken round-robin
//   over layers — expert 0 of every layer, then expert 1, ... — until the next
//   one does not fit. Every other expert lives in host RAM. If dense + KV alone
//   exceed the budget, nothing is placed and that is reported as a problem.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "affinity/status.h"
#include "model/dsv4/config.h"

namespace aff::dsv4 {

struct StoredTensor {
  std::string name;            // as stored (HF or GGUF name)
  std::string type;            // "BF16", "F8_E4M3", "Q8_0", "MXFP4", ...
  std::vector<int64_t> shape;  // as stored (safetensors order, or ggml ne)
  int64_t elements = 0;        // logical weights (packed MXFP4 bytes count 2 each; scales count 0)
  uint64_t bytes = 0;
  int layer = -1;              // main layer index; -1 for non-layer tensors and MTP
  bool routed_expert = false;  // part of a routed expert (weight or its scale)
  int experts_in = 0;          // experts the tensor holds (stacked GGUF: n_routed_experts; HF: 1; else 0)
};

struct TypeTotal {
  int tensors = 0;
  int64_t elements = 0;
  uint64_t bytes = 0;
};

struct ModelSummary {
  std::string source;
  std::string container;       // "GGUF v3" or "checkpoint directory"
  std::optional<ModelConfig> config;
  std::vector<StoredTensor> tensors;
  std::map<std::string, TypeTotal> by_type;  // storage type -> totals (scales under their own dtype)
  TypeTotal experts, dense;    // routed experts vs everything else
  // Bytes of each routed expert unit, indexed [layer][expert] (empty when unknown).
  std::vector<std::vector<uint64_t>> expert_unit_bytes;
  std::vector<std::string> problems;
};

// Reads `path` (directory or GGUF file) and loads it once to validate. Only an
// unreadable path is an error; everything else wrong is listed in problems.
Result<ModelSummary> summarize_model(const std::string& path);

// KV state bytes for ctx positions: per layer, the sliding window
// (sliding_window x head_dim), compressed entries (ctx / ratio x head_dim) and,
// on CSA layers, indexer keys (ctx / 4 x index_head_dim); 4 bytes per value as
// the reference state stores them (a conservative bound for narrower caches).
uint64_t kv_state_bytes(const ModelConfig& cfg, int64_t ctx);

struct Placement {
  uint64_t budget = 0, dense = 0, kv = 0;
  int experts_vram = 0, experts_ram = 0;
  uint64_t expert_bytes_vram = 0, expert_bytes_ram = 0;
  bool dense_fits = false;
};

// The split of the rule above for a budget of gpu_bytes.
Placement plan_placement(const ModelSummary& s, uint64_t gpu_bytes, int64_t ctx);

// Human-readable report (what aff-info prints), placement included when gpu_bytes is set.
std::string format_summary(const ModelSummary& s, std::optional<uint64_t> gpu_bytes, int64_t ctx);

}  // namespace aff::dsv4
