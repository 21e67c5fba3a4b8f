// ModelConfig <-> GGUF metadata, with llama.cpp's `deepseek4.*` keys
// (v4-formats-and-api.md §4.2) so that our containers load elsewhere and
// theirs load here.
//
// Key conventions (what the writer emits, what the reader accepts):
//   deepseek4.block_count            main layers only (MTP blocks are "mtp.K.*"
//                                    tensors, counted by nextn_predict_layers)
//   deepseek4.attention.compress_ratios   u32 array: main layers, then MTP /
//                                    DSpark entries (>= block_count entries)
//   deepseek4.swiglu_clamp_exp       f32 array, one entry per compress_ratios
//                                    entry; a scalar is accepted too. ModelConfig
//                                    has one limit, so differing entries are
//                                    refused (kUnsupported).
//   deepseek4.rope.scaling.type      "yarn" (llama.cpp's generic key); when
//                                    absent, YaRN is on iff rope.scaling.factor is
//   tokenizer.ggml.bos/eos_token_id  from ModelConfig::bos/eos_token_id; a
//                                    tokenizer writer must not write them again
//
// affinity.* keys, for what llama.cpp's deepseek4 metadata does not carry.
// All are optional on read; defaults are the V4-Flash release values:
//   affinity.dsv4.scoring_func            string, "sqrtsoftplus" (the only one
//                                         supported; llama.cpp's
//                                         expert_gating_func enum has no value
//                                         for it, so that key is not written)
//   affinity.dsv4.dspark.block_size       u32  } V4-Flash-0731 only: their
//   affinity.dsv4.dspark.noise_token_id   u32  } presence marks the variant and
//   affinity.dsv4.dspark.markov_rank      u32  } compress_ratios' entries past
//   affinity.dsv4.dspark.target_layer_ids i32[] } block_count are the stages
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "affinity/status.h"
#include "format/gguf_reader.h"
#include "format/gguf_value.h"
#include "format/gguf_writer.h"
#include "model/dsv4/config.h"

namespace aff::dsv4 {

inline constexpr std::string_view kGgufKeyScoringFunc = "affinity.dsv4.scoring_func";
inline constexpr std::string_view kGgufKeyDsparkBlockSize = "affinity.dsv4.dspark.block_size";
inline constexpr std::string_view kGgufKeyDsparkNoiseToken = "affinity.dsv4.dspark.noise_token_id";
inline constexpr std::string_view kGgufKeyDsparkMarkovRank = "affinity.dsv4.dspark.markov_rank";
inline constexpr std::string_view kGgufKeyDsparkTargets = "affinity.dsv4.dspark.target_layer_ids";
inline constexpr std::string_view kGgufKeyRopeScalingType = "deepseek4.rope.scaling.type";

using GgufMetadata = std::vector<std::pair<std::string, format::GgufValue>>;

// The architecture metadata of cfg (general.architecture included), in a
// fixed order. Storage fields (fp8_dense, weight_block, expert_dtype) are not
// written: a GGUF's tensor types say how each weight is stored.
GgufMetadata config_gguf_metadata(const ModelConfig& cfg);

// Declares config_gguf_metadata(cfg) on the writer (before write_header).
Status config_to_gguf(const ModelConfig& cfg, format::GgufWriter& writer);

// Reads and validates the architecture from a deepseek4 GGUF; errors name the
// file and the key. deepseek41 (V4.1) is recognised and refused. Storage
// fields come back as for a plain-float checkpoint (fp8_dense false,
// expert_dtype ""): the loader checks each tensor's ggml type itself.
Result<ModelConfig> config_from_gguf(const format::GgufFile& file);

}  // namespace aff::dsv4
