// Field-by-field equality of two model configs for round-trip tests (config.json
// and GGUF metadata), so a field added to ModelConfig is compared in one place.
#pragma once

#include <gtest/gtest.h>

#include "model/dsv4/config.h"

namespace aff::dsv4::testing {

// kExact: every field, reals bit for bit (config.json). kGgufMetadata: what
// GGUF metadata keeps: reals as f32, the YaRN fields only when YaRN is on, and
// none of the storage fields (fp8_dense, weight_block, expert_dtype), which
// GGUF files describe per tensor.
enum class ConfigFields { kExact, kGgufMetadata };

inline void expect_same_config(const ModelConfig& a, const ModelConfig& b, ConfigFields fields) {
  const bool gguf = fields == ConfigFields::kGgufMetadata;
  auto real = [&](double x, double y, const char* name) {
    if (gguf) {
      EXPECT_FLOAT_EQ(float(x), float(y)) << name;
    } else {
      EXPECT_EQ(x, y) << name;
    }
  };
  EXPECT_EQ(a.variant, b.variant);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.num_layers, b.num_layers);
  EXPECT_EQ(a.num_mtp_layers, b.num_mtp_layers);
  EXPECT_EQ(a.num_heads, b.num_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.rope_dim, b.rope_dim);
  EXPECT_EQ(a.q_lora_rank, b.q_lora_rank);
  EXPECT_EQ(a.o_groups, b.o_groups);
  EXPECT_EQ(a.o_lora_rank, b.o_lora_rank);
  EXPECT_EQ(a.sliding_window, b.sliding_window);
  EXPECT_EQ(a.compress_ratios, b.compress_ratios);
  real(a.rope_theta, b.rope_theta, "rope_theta");
  real(a.compress_rope_theta, b.compress_rope_theta, "compress_rope_theta");
  EXPECT_EQ(a.rope_scaling.yarn, b.rope_scaling.yarn);
  if (!gguf || a.rope_scaling.yarn) {  // without YaRN, GGUF does not store the other fields
    real(a.rope_scaling.factor, b.rope_scaling.factor, "rope_scaling.factor");
    EXPECT_EQ(a.rope_scaling.original_max_position, b.rope_scaling.original_max_position);
    real(a.rope_scaling.beta_fast, b.rope_scaling.beta_fast, "rope_scaling.beta_fast");
    real(a.rope_scaling.beta_slow, b.rope_scaling.beta_slow, "rope_scaling.beta_slow");
  }
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_EQ(a.index_n_heads, b.index_n_heads);
  EXPECT_EQ(a.index_head_dim, b.index_head_dim);
  EXPECT_EQ(a.index_topk, b.index_topk);
  EXPECT_EQ(a.n_routed_experts, b.n_routed_experts);
  EXPECT_EQ(a.n_shared_experts, b.n_shared_experts);
  EXPECT_EQ(a.n_experts_per_tok, b.n_experts_per_tok);
  EXPECT_EQ(a.moe_inter, b.moe_inter);
  EXPECT_EQ(a.num_hash_layers, b.num_hash_layers);
  EXPECT_EQ(a.scoring_func, b.scoring_func);
  real(a.routed_scaling_factor, b.routed_scaling_factor, "routed_scaling_factor");
  EXPECT_EQ(a.norm_topk_prob, b.norm_topk_prob);
  real(a.swiglu_limit, b.swiglu_limit, "swiglu_limit");
  real(a.rms_norm_eps, b.rms_norm_eps, "rms_norm_eps");
  EXPECT_EQ(a.hc_mult, b.hc_mult);
  EXPECT_EQ(a.hc_sinkhorn_iters, b.hc_sinkhorn_iters);
  real(a.hc_eps, b.hc_eps, "hc_eps");
  EXPECT_EQ(a.bos_token_id, b.bos_token_id);
  EXPECT_EQ(a.eos_token_id, b.eos_token_id);
  if (!gguf) {
    EXPECT_EQ(a.fp8_dense, b.fp8_dense);
    EXPECT_EQ(a.weight_block, b.weight_block);
    EXPECT_EQ(a.expert_dtype, b.expert_dtype);
  }
  EXPECT_EQ(a.num_dspark_stages, b.num_dspark_stages);
  EXPECT_EQ(a.dspark_block_size, b.dspark_block_size);
  EXPECT_EQ(a.dspark_noise_token_id, b.dspark_noise_token_id);
  EXPECT_EQ(a.dspark_markov_rank, b.dspark_markov_rank);
  EXPECT_EQ(a.dspark_target_layer_ids, b.dspark_target_layer_ids);
}

}  // namespace aff::dsv4::testing
