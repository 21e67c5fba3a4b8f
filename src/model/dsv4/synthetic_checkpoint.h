// Random-weight checkpoints in the exact official V4 layout (config.json,
// model.safetensors.index.json + shards, FP8 block-scaled dense weights, MXFP4
// experts, BF16/F32 elsewhere), for any ModelConfig. Deterministic in the
// seed: every tensor's bytes depend only on (seed, name, layout), so tests can
// regenerate what was written and compare it with what was loaded.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "affinity/status.h"
#include "core/dtype.h"
#include "model/dsv4/config.h"
#include "model/dsv4/weights.h"
#include "model/dsv4/weights_bind.h"

namespace aff::dsv4 {

struct SyntheticCheckpointOptions {
  uint64_t seed = 1;
  uint64_t max_shard_bytes = 256ull << 20;  // a shard is closed once it holds this much
  bool single_file = false;                 // one model.safetensors, no index
};

// A small config with every V4 feature: sliding, CSA (indexer) and HCA layers,
// hash-routed layers, shared expert, MTP block (or, for kV4Flash0731, three
// DSpark stages); odd vocab and a hidden size that is not a multiple of the
// FP8 block, so partial scale blocks are exercised.
ModelConfig synthetic_tiny_config(Variant variant = Variant::kV4Flash);

// One unit of the layout: a Linear (weight + optional scale) or a plain tensor.
struct SyntheticUnit {
  std::string name;             // tensor name, or the Linear's stem
  bool is_linear = false;
  WeightFormat format = WeightFormat::kBF16;  // Linear storage
  TensorKind kind = TensorKind::kF32;         // plain tensor role
  DType dtype = DType::kF32;                  // plain tensor dtype
  std::vector<int64_t> shape;   // tensor shape, or logical [out, in] of the Linear
  uint64_t stored_bytes = 0;    // bytes of all tensors of the unit
};

struct SyntheticTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// The layout of cfg as the synthetic writer stores it, in file order.
Result<std::vector<SyntheticUnit>> synthetic_checkpoint_plan(const ModelConfig& cfg);

// The stored tensors of one unit (weight then scale for quantised Linears).
std::vector<SyntheticTensor> synthetic_unit_tensors(const ModelConfig& cfg, const SyntheticUnit& unit,
                                                    uint64_t seed);

// Writes config.json and the safetensors (sharded with an index unless
// single_file) into `dir`, creating it if needed.
Status write_synthetic_checkpoint(const ModelConfig& cfg, const std::string& dir,
                                  const SyntheticCheckpointOptions& options = {});

}  // namespace aff::dsv4
