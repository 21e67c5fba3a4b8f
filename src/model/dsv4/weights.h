// The V4 weights as views into mapped files. Binding validates every name,
// dtype and shape; the math reads the stored (FP8/FP4/BF16) values directly.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace aff::dsv4 {

// How a 2-D weight [out, in] is stored.
enum class WeightFormat {
  kF32,
  kBF16,
  kF16,
  kFP8Block,  // weight F8_E4M3 [out, in]; scale F8_E8M0 [ceil(out/B), ceil(in/B)], B = block
  kMXFP4,     // weight I8 [out, in/2] (low nibble = even column); scale F8_E8M0 [out, in/32]
  kGgml,      // a ggml block format (GGUF): weight U8 [out, row_bytes], row r = ggml blocks of
              // `in` elements; Linear::ggml_type says which (quant::GgmlType id)
};

struct Linear {
  TensorView weight;
  TensorView scale;  // only for kFP8Block / kMXFP4
  WeightFormat format = WeightFormat::kBF16;
  int64_t out = 0;   // rows
  int64_t in = 0;    // logical columns
  int block = 128;   // kFP8Block tile edge
  int ggml_type = -1;  // kGgml: the quant::GgmlType id of every row
  bool valid() const { return weight.valid(); }
};

// One mHC site: fn f32 [(2+hc)*hc, hc*D], base f32 [(2+hc)*hc], scale f32 [3].
// The final collapse (hc_head) uses fn [hc, hc*D], base [hc], scale [1].
struct HcWeights {
  TensorView fn, base, scale;
};

// KV pooling. d = 512 (attention) or index_head_dim (indexer); c = 2 when
// ratio == 4 (overlapping windows), else 1.
struct CompressorWeights {
  bool present = false;
  int ratio = 0;
  int dim = 0;            // d
  bool overlap = false;   // c == 2
  Linear wkv;             // [c*d, D], BF16 (math in f32)
  Linear wgate;           // [c*d, D], BF16
  TensorView ape;         // f32 [ratio, c*d]
  TensorView norm;        // bf16 [d]
};

struct IndexerWeights {
  bool present = false;
  Linear wq_b;               // [index_n_heads*index_head_dim, q_lora_rank], FP8
  Linear weights_proj;       // [index_n_heads, D], BF16
  CompressorWeights compressor;
};

struct AttentionWeights {
  Linear wq_a;               // [q_lora_rank, D]
  TensorView q_norm;         // [q_lora_rank]
  Linear wq_b;               // [H*Dh, q_lora_rank]
  Linear wkv;                // [Dh, D]
  TensorView kv_norm;        // [Dh]
  Linear wo_a;               // [o_groups*o_lora_rank, (H/o_groups)*Dh]; group g = rows [g*o_lora, (g+1)*o_lora)
  Linear wo_b;               // [D, o_groups*o_lora_rank]
  TensorView attn_sink;      // f32 [H]
  CompressorWeights compressor;  // ratio != 0 only
  IndexerWeights indexer;        // ratio == 4 only
};

struct ExpertWeights {
  Linear w1;  // gate [moe_inter, D]
  Linear w3;  // up   [moe_inter, D]
  Linear w2;  // down [D, moe_inter]
};

struct MoeWeights {
  Linear gate;                        // router [n_routed_experts, D], BF16
  TensorView gate_bias;               // f32 [n_routed_experts]; absent on hash layers
  TensorView tid2eid;                 // I64 or I32 [vocab, n_experts_per_tok]; hash layers only
  std::vector<ExpertWeights> experts; // n_routed_experts
  ExpertWeights shared;               // n_shared_experts == 1
  bool has_shared = false;
};

struct LayerWeights {
  int index = 0;
  HcWeights hc_attn, hc_ffn;
  TensorView attn_norm, ffn_norm;  // [D]
  AttentionWeights attn;
  MoeWeights ffn;
};

struct MtpWeights {
  Linear e_proj, h_proj;          // [D, D]
  TensorView enorm, hnorm, norm;  // [D]
  HcWeights hc_head;
  LayerWeights block;
};

// V4-Flash-0731 DSpark drafter: stages mtp.0..S-1 are full blocks (ratio from
// compress_ratios[num_layers + s], bias-gated MoE); the fusion input lives on
// stage 0 and the heads on the last stage.
struct DsparkWeights {
  Linear main_proj;               // [D, D * n_target_layers] (mtp.0.main_proj), FP8 or plain
  TensorView main_norm;           // [D] (mtp.0.main_norm)
  std::vector<LayerWeights> stages;
  TensorView norm;                // [D] (mtp.{S-1}.norm)
  HcWeights hc_head;              // mtp.{S-1}.hc_head_*
  TensorView markov_w1;           // bf16 [vocab, markov_rank], an embedding table
  Linear markov_w2;               // [vocab, markov_rank], plain (bf16)
  Linear confidence_proj;         // [1, D + markov_rank], plain (bf16)
  bool present() const { return !stages.empty(); }
};

struct ModelWeights {
  TensorView embed;               // bf16 [vocab, D]
  // GGUF files may store the embedding table in a ggml block format; then
  // embed is empty and this kGgml Linear [vocab, D] holds it (rows are looked
  // up one at a time, never dequantised whole).
  Linear embed_rows;
  Linear head;                    // [vocab, D]
  TensorView norm;                // [D]
  HcWeights hc_head;
  std::vector<LayerWeights> layers;
  std::vector<MtpWeights> mtp;
  DsparkWeights dspark;           // 0731 only
};

}  // namespace aff::dsv4
