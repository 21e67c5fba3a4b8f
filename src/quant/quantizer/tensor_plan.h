// The output tensors of a container, planned from an HF checkpoint: GGUF name, type,
// ggml shape, and where each row's f32 values come from. Routed experts are stacked per
// layer as llama.cpp does (ne = [in, out, n_expert], expert slowest), so a stacked
// tensor lists one source Linear per expert. Nothing is read here; the plan only holds
// views into the mapped shards.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "affinity/status.h"
#include "format/tensor_index.h"
#include "model/dsv4/config.h"
#include "model/dsv4/weights.h"
#include "quant/quantizer/recipe.h"

namespace aff::quant {

struct PlannedTensor {
  std::string name;                 // GGUF name
  std::string hf_name;              // source tensor (first expert's for a stack)
  TensorRole role = TensorRole::kSmallF32;
  TypeChoice type{GgmlType::kF32, GgmlType::kF32};
  std::vector<int64_t> ne;          // ggml order: ne[0] = row length
  int64_t rows = 0;                 // rows per matrix (ne[1], 1 for 1-D)
  int64_t row_bytes = 0;            // bytes of one output row
  // One Linear per matrix ([rows, ne[0]] each): experts of a stack, or the single
  // weight. Plain tensors (norms, embedding, ape...) are wrapped as F32/BF16 Linears.
  std::vector<dsv4::Linear> mats;
  TensorView ids;                   // kExpertIds only: I64|I32 [vocab, k]
  int64_t n_mat() const { return int64_t(mats.empty() ? 1 : mats.size()); }
  uint64_t nbytes() const { return uint64_t(n_mat() * rows * row_bytes); }
};

struct PlanOptions {
  int max_layers = 0;  // > 0: keep only blocks [0, max_layers) (MTP blocks are kept)
};

// Plans every tensor of the layout of `cfg` (the config the checkpoint was loaded
// with) in layout order. Fails naming the tensor if one has no deepseek4 GGUF name
// (e.g. DSpark drafter tensors of V4-Flash-0731, which llama.cpp's names do not cover).
Result<std::vector<PlannedTensor>> plan_tensors(const dsv4::ModelConfig& cfg, const format::TensorIndex& index,
                                                const Recipe& recipe, const std::vector<TypeRule>& rules,
                                                const PlanOptions& options);

// cfg cut to its first max_layers blocks (compress_ratios, hash layers), for metadata.
dsv4::ModelConfig truncate_layers(const dsv4::ModelConfig& cfg, int max_layers);

}  // namespace aff::quant
