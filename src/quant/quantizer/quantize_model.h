// HF checkpoint directory -> deepseek4 GGUF container. Streams: tensors are planned from
// the mapped shards, cut into row jobs, quantised by a pool of threads and written in
// plan order, with at most a small window of finished jobs held in memory. The output
// bytes depend only on the inputs (never on the thread count or timing), are written to
// "<out>.tmp" and renamed into place only when every tensor succeeded.
//
// Metadata written besides the architecture (config_gguf.h) and tokenizer
// (tokenizer_metadata.h):
//   general.name                     checkpoint directory name
//   general.quantization_version     u32 2 (ggml's current block layouts)
//   affinity.quantize.recipe         string, the recipe name
//   affinity.quantize.imatrix        string, the imatrix file name (only with --imatrix)
//   affinity.expert_popularity       f32 array [block_count * expert_count], layer-major:
//                                    entry (L, e) = share of layer L's routed token slots
//                                    that went to expert e (sums to 1 per layer), from the
//                                    GGUF imatrix's per-expert counts of
//                                    blk.L.ffn_gate_exps.weight; a layer the imatrix has
//                                    no counts for is all zeros. Written only when the
//                                    imatrix is GGUF (legacy .dat has no per-expert counts).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "affinity/status.h"
#include "quant/quantizer/recipe.h"

namespace aff::quant {

inline constexpr std::string_view kGgufKeyExpertPopularity = "affinity.expert_popularity";
inline constexpr std::string_view kGgufKeyQuantizeRecipe = "affinity.quantize.recipe";
inline constexpr std::string_view kGgufKeyQuantizeImatrix = "affinity.quantize.imatrix";

struct QuantizeProgress {
  uint64_t bytes_done = 0;     // output tensor bytes written
  uint64_t bytes_total = 0;
  size_t tensors_done = 0;
  size_t tensors_total = 0;
  std::string tensor;          // tensor being written
  double elapsed_s = 0.0;
};

struct QuantizeOptions {
  std::string src_dir;
  std::string out_path;
  std::string recipe = "q4";
  std::vector<TypeRule> rules;       // applied after the recipe, last match wins
  std::string imatrix_path;          // empty: none
  int max_layers = 0;                // > 0: first N blocks only
  int threads = 1;
  std::function<void(const QuantizeProgress&)> on_progress;  // after each written job
  std::function<void(const std::string&)> on_note;           // warnings and fallbacks
};

struct QuantizeSummary {
  size_t n_tensors = 0;
  uint64_t data_bytes = 0;
  std::map<std::string, std::pair<uint64_t, uint64_t>> by_type;  // ggml type -> (elements, bytes)
  uint64_t expert_elements = 0, expert_bytes = 0;
  size_t fallbacks = 0;              // tensors written in another type than asked
  size_t imatrix_tensors = 0;        // tensors that used imatrix importance
  bool popularity_written = false;
  double seconds = 0.0;
};

Result<QuantizeSummary> quantize_checkpoint(const QuantizeOptions& options);

}  // namespace aff::quant
