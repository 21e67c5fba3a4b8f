// DeepSeek-V4 family configuration: everything the forward pass needs to know
// about the architecture, read from the checkpoint's config.json (or a GGUF's
// metadata) and never compiled in. Field names follow the HF config keys.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace aff::dsv4 {

enum class Variant {
  kV4Flash,      // DeepSeek-V4-Flash (and -Base): 1 MTP block
  kV4Flash0731,  // same backbone; DSpark drafter stages instead of the MTP block
  kV41Flash,     // deepseek_v41: recognised, refused for now
};

struct RopeScaling {
  bool yarn = false;                       // rope_scaling.type == "yarn"
  double factor = 1.0;                     // 16 in V4-Flash
  int64_t original_max_position = 0;       // original_max_position_embeddings (65536)
  double beta_fast = 32.0;
  double beta_slow = 1.0;
};

struct ModelConfig {
  Variant variant = Variant::kV4Flash;
  std::string model_type;                  // "deepseek_v4"

  int64_t vocab_size = 0;                  // 129280
  int64_t hidden_size = 0;                 // D = 4096
  int num_layers = 0;                      // num_hidden_layers = 43
  int num_mtp_layers = 0;                  // num_nextn_predict_layers (0 or 1)

  // Attention
  int num_heads = 0;                       // H = 64
  int head_dim = 0;                        // Dh = 512 (one shared latent, K = V)
  int rope_dim = 0;                        // qk_rope_head_dim = 64: the LAST rope_dim dims of a head
  int q_lora_rank = 0;                     // 1024
  int o_groups = 0;                        // 8
  int o_lora_rank = 0;                     // 1024
  int sliding_window = 0;                  // 128
  std::vector<int> compress_ratios;        // per layer (+ MTP entries): 0 = SWA, 4 = CSA, else HCA
  double rope_theta = 10000.0;             // SWA layers, plain RoPE
  double compress_rope_theta = 160000.0;   // compressed layers, with YaRN
  RopeScaling rope_scaling;                // applied only on compressed layers
  int64_t max_position_embeddings = 0;

  // Lightning indexer (CSA layers)
  int index_n_heads = 0;                   // 64
  int index_head_dim = 0;                  // 128
  int index_topk = 0;                      // 512

  // MoE
  int n_routed_experts = 0;                // 256
  int n_shared_experts = 0;                // 1
  int n_experts_per_tok = 0;               // num_experts_per_tok = 6
  int moe_inter = 0;                       // moe_intermediate_size = 2048
  int num_hash_layers = 0;                 // layers [0, num_hash_layers) route by tid2eid
  std::string scoring_func;                // "sqrtsoftplus"
  double routed_scaling_factor = 1.0;      // 1.5
  bool norm_topk_prob = true;
  double swiglu_limit = 0.0;               // 10.0; 0 disables the clamp

  // Norms and hyper-connections
  double rms_norm_eps = 1e-6;
  int hc_mult = 0;                         // 4 streams
  int hc_sinkhorn_iters = 0;               // 20
  double hc_eps = 1e-6;

  int bos_token_id = 0;
  int eos_token_id = 1;

  // Storage
  bool fp8_dense = false;                  // quantization_config.quant_method == "fp8"
  int weight_block = 128;                  // weight_block_size (square)
  std::string expert_dtype;                // "fp4" (MXFP4) | "fp8" (Base) | "" (= dense dtype)

  // V4-Flash-0731 DSpark drafter (all zero/empty for other variants). Its
  // stages are blocks mtp.0..S-1 with compress_ratios[num_layers + s].
  int num_dspark_stages = 0;               // compress_ratios entries beyond num_layers (3)
  int dspark_block_size = 0;               // 5 draft positions per step
  int dspark_noise_token_id = 0;           // 128799
  int dspark_markov_rank = 0;              // 256
  std::vector<int> dspark_target_layer_ids;  // [40, 41, 42]: main layers whose outputs feed main_proj

  int compress_ratio(int layer) const { return compress_ratios.at(size_t(layer)); }
  bool is_hash_layer(int layer) const { return layer < num_hash_layers; }
};

}  // namespace aff::dsv4
