#include "model/dsv4/config_gguf.h"

#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "format/gguf_dsv4_names.h"
#include "model/dsv4/config_json.h"

namespace aff::dsv4 {

namespace key = format::dsv4_key;
using format::GgufType;
using format::GgufValue;

GgufMetadata config_gguf_metadata(const ModelConfig& c) {
  GgufMetadata m;
  auto put = [&](std::string_view k, GgufValue v) { m.emplace_back(std::string(k), std::move(v)); };
  auto u32 = [&](std::string_view k, int64_t v) { put(k, GgufValue::u32(uint32_t(v))); };
  auto f32 = [&](std::string_view k, double v) { put(k, GgufValue::f32(float(v))); };

  put(key::kArchitecture, GgufValue::string(std::string(format::kDsv4Arch)));
  u32(key::kBlockCount, c.num_layers);
  u32(key::kContextLength, c.max_position_embeddings);
  u32(key::kEmbeddingLength, c.hidden_size);
  u32(key::kVocabSize, c.vocab_size);
  u32(key::kHeadCount, c.num_heads);
  u32(key::kHeadCountKv, 1);
  u32(key::kKeyLength, c.head_dim);
  u32(key::kValueLength, c.head_dim);
  u32(key::kRopeDimensionCount, c.rope_dim);
  u32(key::kQLoraRank, c.q_lora_rank);
  u32(key::kOutputLoraRank, c.o_lora_rank);
  u32(key::kOutputGroupCount, c.o_groups);
  put(key::kCompressRatios, GgufValue::array(GgufType::kU32, c.compress_ratios));
  f32(key::kCompressRopeFreqBase, c.compress_rope_theta);
  u32(key::kSlidingWindow, c.sliding_window);
  u32(key::kIndexerHeadCount, c.index_n_heads);
  u32(key::kIndexerKeyLength, c.index_head_dim);
  u32(key::kIndexerTopK, c.index_topk);
  f32(key::kRmsEps, c.rms_norm_eps);
  u32(key::kExpertCount, c.n_routed_experts);
  u32(key::kExpertUsedCount, c.n_experts_per_tok);
  u32(key::kExpertSharedCount, c.n_shared_experts);
  u32(key::kExpertFeedForwardLength, c.moe_inter);
  f32(key::kExpertWeightsScale, c.routed_scaling_factor);
  put(key::kExpertWeightsNorm, GgufValue::boolean(c.norm_topk_prob));
  u32(key::kExpertGroupCount, 0);
  u32(key::kExpertGroupUsedCount, 0);
  u32(key::kHashLayerCount, c.num_hash_layers);
  u32(key::kHcCount, c.hc_mult);
  u32(key::kHcSinkhornIterations, c.hc_sinkhorn_iters);
  f32(key::kHcEpsilon, c.hc_eps);
  // One clamp per block (main layers, then MTP/DSpark), as llama.cpp stores it.
  put(key::kSwigluClampExp,
      GgufValue::array(GgufType::kF32, std::vector<double>(c.compress_ratios.size(), c.swiglu_limit)));
  f32(key::kRopeFreqBase, c.rope_theta);
  if (c.rope_scaling.yarn) {
    put(kGgufKeyRopeScalingType, GgufValue::string("yarn"));
    f32(key::kRopeScalingFactor, c.rope_scaling.factor);
    u32(key::kRopeScalingOrigCtx, c.rope_scaling.original_max_position);
    f32(key::kRopeYarnBetaFast, c.rope_scaling.beta_fast);
    f32(key::kRopeYarnBetaSlow, c.rope_scaling.beta_slow);
  }
  if (c.num_mtp_layers > 0) u32(key::kNextnPredictLayers, c.num_mtp_layers);
  u32(key::kTokenizerBos, c.bos_token_id);
  u32(key::kTokenizerEos, c.eos_token_id);
  put(kGgufKeyScoringFunc, GgufValue::string(c.scoring_func.empty() ? "sqrtsoftplus" : c.scoring_func));
  if (c.variant == Variant::kV4Flash0731) {
    u32(kGgufKeyDsparkBlockSize, c.dspark_block_size);
    u32(kGgufKeyDsparkNoiseToken, c.dspark_noise_token_id);
    u32(kGgufKeyDsparkMarkovRank, c.dspark_markov_rank);
    put(kGgufKeyDsparkTargets, GgufValue::array(GgufType::kI32, c.dspark_target_layer_ids));
  }
  return m;
}

Status config_to_gguf(const ModelConfig& cfg, format::GgufWriter& writer) {
  for (auto& [k, v] : config_gguf_metadata(cfg)) AFF_RETURN_IF_ERROR(writer.set(k, v));
  return Status::ok();
}

namespace {

// Typed, range-checked reads of one file's metadata; the first failure sticks
// (like config_json's FieldReader) so the parser reads straight through.
class MetaReader {
 public:
  explicit MetaReader(const format::GgufFile& f) : f_(f) {}

  bool has(std::string_view k) const { return f_.find(k) != nullptr; }
  const Status& status() const { return status_; }

  // The value of key k read by `get`; the fallback when k is absent; nothing
  // when the reader has already failed, or k is required and missing or
  // unreadable (the failure then sticks in status_).
  template <typename T, typename Get>
  std::optional<T> read(std::string_view k, std::optional<T> fallback, Get get) {
    if (!status_.is_ok()) return std::nullopt;
    if (!has(k)) {
      if (!fallback) status_ = missing(k);
      return fallback;
    }
    auto r = get(k);
    if (!r) {
      status_ = r.status();
      return std::nullopt;
    }
    return std::move(r).value();
  }
  Status missing(std::string_view k) const {
    return not_found(fmt::format("{}: metadata key '{}' is missing (required for deepseek4)", f_.label(), k));
  }

  // Non-negative integer that fits an int; required unless a fallback is given.
  int i32(std::string_view k, std::optional<int> fallback = std::nullopt) {
    const int64_t v = i64(k, fallback ? std::optional<int64_t>(*fallback) : std::nullopt);
    if (v > std::numeric_limits<int>::max()) fail(k, fmt::format("value {} is too large", v));
    return int(v);
  }
  int64_t i64(std::string_view k, std::optional<int64_t> fallback = std::nullopt) {
    const auto v = read<int64_t>(k, fallback, [&](std::string_view key) { return f_.get_int(key); });
    if (!v) return 0;
    if (*v < 0) fail(k, fmt::format("value {} is negative", *v));
    return *v;
  }
  double f64(std::string_view k, std::optional<double> fallback = std::nullopt) {
    const auto v = read<double>(k, fallback, [&](std::string_view key) { return f_.get_float(key); });
    if (!v) return 0;
    if (!std::isfinite(*v)) fail(k, "value is not finite");
    return *v;
  }
  bool boolean(std::string_view k, bool fallback) {
    return read<bool>(k, fallback, [&](std::string_view key) { return f_.get_bool(key); }).value_or(fallback);
  }
  std::string str(std::string_view k, std::string fallback) {
    return read<std::string>(k, fallback, [&](std::string_view key) { return f_.get_string(key); })
        .value_or(std::move(fallback));
  }
  // A numeric array (a scalar counts as one entry) as ints.
  std::vector<int> int_array(std::string_view k, bool required) {
    std::vector<int> out;
    if (!status_.is_ok()) return out;
    const GgufValue* v = f_.find(k);
    if (!v) {
      if (required) status_ = missing(k);
      return out;
    }
    if (!v->is_array()) {
      out.push_back(i32(k));
      return out;
    }
    for (size_t i = 0; i < v->array_size(); ++i) {
      const auto e = v->array_int(i);
      if (!e || *e < 0 || *e > std::numeric_limits<int>::max()) {
        fail(k, fmt::format("entry {} is not a non-negative integer", i));
        return {};
      }
      out.push_back(int(*e));
    }
    return out;
  }
  std::vector<double> float_array(std::string_view k) {
    std::vector<double> out;
    if (!status_.is_ok()) return out;
    const GgufValue* v = f_.find(k);
    if (!v) return out;
    if (!v->is_array()) {
      out.push_back(f64(k));
      return out;
    }
    for (size_t i = 0; i < v->array_size(); ++i) {
      const auto e = v->array_float(i);
      if (!e || !std::isfinite(*e)) {
        fail(k, fmt::format("entry {} is not a finite number", i));
        return {};
      }
      out.push_back(*e);
    }
    return out;
  }

  void fail(std::string_view k, const std::string& what) {
    if (status_.is_ok()) status_ = corrupt(fmt::format("{}: metadata key '{}': {}", f_.label(), k, what));
  }

 private:
  const format::GgufFile& f_;
  Status status_;
};

}  // namespace

Result<ModelConfig> config_from_gguf(const format::GgufFile& f) {
  AFF_ASSIGN_OR_RETURN(std::string arch, f.architecture());
  if (arch == "deepseek41") {
    return unsupported(fmt::format("{}: general.architecture is 'deepseek41' (DeepSeek-V4.1: Engram tables, "
                                   "single-pass mHC), which is not supported yet", f.label()));
  }
  if (arch != format::kDsv4Arch) {
    return unsupported(fmt::format("{}: general.architecture is '{}'; only '{}' (DeepSeek-V4-Flash) is supported",
                                   f.label(), arch, format::kDsv4Arch));
  }

  MetaReader r(f);
  ModelConfig c;
  c.model_type = "deepseek_v4";
  c.num_layers = r.i32(key::kBlockCount);
  c.hidden_size = r.i64(key::kEmbeddingLength);
  c.vocab_size = r.i64(key::kVocabSize, std::nullopt);
  c.max_position_embeddings = r.i64(key::kContextLength, 0);
  c.num_heads = r.i32(key::kHeadCount);
  const int kv_heads = r.i32(key::kHeadCountKv, 1);
  c.head_dim = r.i32(key::kKeyLength);
  const int value_length = r.i32(key::kValueLength, c.head_dim);
  c.rope_dim = r.i32(key::kRopeDimensionCount);
  c.q_lora_rank = r.i32(key::kQLoraRank);
  c.o_lora_rank = r.i32(key::kOutputLoraRank);
  c.o_groups = r.i32(key::kOutputGroupCount);
  c.compress_ratios = r.int_array(key::kCompressRatios, true);
  c.compress_rope_theta = r.f64(key::kCompressRopeFreqBase, 160000.0);
  c.sliding_window = r.i32(key::kSlidingWindow);
  c.index_n_heads = r.i32(key::kIndexerHeadCount, 0);
  c.index_head_dim = r.i32(key::kIndexerKeyLength, 0);
  c.index_topk = r.i32(key::kIndexerTopK, 0);
  c.rms_norm_eps = r.f64(key::kRmsEps, 1e-6);
  c.n_routed_experts = r.i32(key::kExpertCount);
  c.n_experts_per_tok = r.i32(key::kExpertUsedCount);
  c.n_shared_experts = r.i32(key::kExpertSharedCount, 0);
  c.moe_inter = r.i32(key::kExpertFeedForwardLength);
  c.routed_scaling_factor = r.f64(key::kExpertWeightsScale, 1.0);
  c.norm_topk_prob = r.boolean(key::kExpertWeightsNorm, true);
  const int group_count = r.i32(key::kExpertGroupCount, 0);
  c.num_hash_layers = r.i32(key::kHashLayerCount, 0);
  c.hc_mult = r.i32(key::kHcCount);
  c.hc_sinkhorn_iters = r.i32(key::kHcSinkhornIterations);
  c.hc_eps = r.f64(key::kHcEpsilon, 1e-6);
  const std::vector<double> clamps = r.float_array(key::kSwigluClampExp);
  c.rope_theta = r.f64(key::kRopeFreqBase, 10000.0);
  const std::string scaling_type = r.str(kGgufKeyRopeScalingType, "");
  c.rope_scaling.yarn = scaling_type.empty() ? r.has(key::kRopeScalingFactor) : scaling_type == "yarn";
  if (c.rope_scaling.yarn) {
    c.rope_scaling.factor = r.f64(key::kRopeScalingFactor);
    c.rope_scaling.original_max_position = r.i64(key::kRopeScalingOrigCtx);
    c.rope_scaling.beta_fast = r.f64(key::kRopeYarnBetaFast, 32.0);
    c.rope_scaling.beta_slow = r.f64(key::kRopeYarnBetaSlow, 1.0);
  }
  const int nextn = r.i32(key::kNextnPredictLayers, 0);
  c.bos_token_id = r.i32(key::kTokenizerBos, 0);
  c.eos_token_id = r.i32(key::kTokenizerEos, 1);
  c.scoring_func = r.str(kGgufKeyScoringFunc, "sqrtsoftplus");
  const bool dspark = r.has(kGgufKeyDsparkBlockSize) || r.has(kGgufKeyDsparkTargets);
  if (dspark) {
    c.variant = Variant::kV4Flash0731;
    c.num_dspark_stages = int(c.compress_ratios.size()) - c.num_layers;
    c.dspark_block_size = r.i32(kGgufKeyDsparkBlockSize, 5);
    c.dspark_noise_token_id = r.i32(kGgufKeyDsparkNoiseToken, 128799);
    c.dspark_markov_rank = r.i32(kGgufKeyDsparkMarkovRank, 256);
    c.dspark_target_layer_ids = r.int_array(kGgufKeyDsparkTargets, true);
  } else {
    c.variant = Variant::kV4Flash;
    c.num_mtp_layers = nextn;
  }
  AFF_RETURN_IF_ERROR(r.status());

  if (kv_heads != 1) {
    return unsupported(fmt::format("{}: metadata key '{}' is {}; DeepSeek-V4 has one shared KV latent (1)",
                                   f.label(), key::kHeadCountKv, kv_heads));
  }
  if (value_length != c.head_dim) {
    return unsupported(fmt::format("{}: metadata key '{}' is {} but '{}' is {}; V4 shares K and V", f.label(),
                                   key::kValueLength, value_length, key::kKeyLength, c.head_dim));
  }
  if (group_count > 1) {
    return unsupported(fmt::format("{}: metadata key '{}' is {}; V4 routes without expert groups", f.label(),
                                   key::kExpertGroupCount, group_count));
  }
  if (c.scoring_func != "sqrtsoftplus") {
    return unsupported(fmt::format("{}: metadata key '{}' is '{}'; only 'sqrtsoftplus' is supported", f.label(),
                                   kGgufKeyScoringFunc, c.scoring_func));
  }
  if (!c.rope_scaling.yarn && !scaling_type.empty() && scaling_type != "none") {
    return unsupported(fmt::format("{}: metadata key '{}' is '{}'; expected 'yarn' or 'none'", f.label(),
                                   kGgufKeyRopeScalingType, scaling_type));
  }
  if (c.n_shared_experts > 1) {
    return unsupported(fmt::format("{}: metadata key '{}' is {}; only 0 or 1 is supported", f.label(),
                                   key::kExpertSharedCount, c.n_shared_experts));
  }
  // ModelConfig has one clamp; llama.cpp stores it per block.
  c.swiglu_limit = clamps.empty() ? 0.0 : clamps[0];
  for (size_t i = 1; i < clamps.size(); ++i) {
    if (clamps[i] != clamps[0]) {
      return unsupported(fmt::format("{}: metadata key '{}': entry {} is {} but entry 0 is {}; per-layer clamps "
                                     "are not supported", f.label(), key::kSwigluClampExp, i, clamps[i],
                                     clamps[0]));
    }
  }
  if (dspark && c.num_dspark_stages <= 0) {
    return corrupt(fmt::format("{}: DSpark keys are present but '{}' has no entries beyond the {} layers",
                               f.label(), key::kCompressRatios, c.num_layers));
  }
  // validate_config names config.json fields; the message still names the file.
  AFF_RETURN_IF_ERROR(validate_config(c, f.label()));
  return c;
}

}  // namespace aff::dsv4
