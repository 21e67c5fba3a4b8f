// DeepSeek-V4 names in GGUF: llama.cpp's `deepseek4` architecture tensor names and
// metadata keys, and the mapping between official HF checkpoint names and GGUF names.
// GGUF stacks the 256 routed experts of a layer into one 3-D tensor per projection
// (blk.N.ffn_{gate,up,down}_exps.weight, ne = [in, out, n_expert]); an HF expert tensor
// is one slice of it. HF ".scale" companions (FP8/FP4 block scales) have no GGUF tensor:
// they fold into the quantised weight, so they map to their weight's GGUF name.
// MTP tensors keep ds4's "mtp.K.<gguf block name>" spelling (upstream's MTP naming for
// deepseek4 was not verified against a real file).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace aff::format {

inline constexpr std::string_view kDsv4Arch = "deepseek4";

// Metadata keys written/read for general.architecture = deepseek4.
namespace dsv4_key {
inline constexpr std::string_view kArchitecture = "general.architecture";
inline constexpr std::string_view kBlockCount = "deepseek4.block_count";
inline constexpr std::string_view kContextLength = "deepseek4.context_length";
inline constexpr std::string_view kEmbeddingLength = "deepseek4.embedding_length";
inline constexpr std::string_view kVocabSize = "deepseek4.vocab_size";
inline constexpr std::string_view kHeadCount = "deepseek4.attention.head_count";
inline constexpr std::string_view kHeadCountKv = "deepseek4.attention.head_count_kv";
inline constexpr std::string_view kKeyLength = "deepseek4.attention.key_length";
inline constexpr std::string_view kValueLength = "deepseek4.attention.value_length";
inline constexpr std::string_view kRopeDimensionCount = "deepseek4.rope.dimension_count";
inline constexpr std::string_view kQLoraRank = "deepseek4.attention.q_lora_rank";
inline constexpr std::string_view kOutputLoraRank = "deepseek4.attention.output_lora_rank";
inline constexpr std::string_view kOutputGroupCount = "deepseek4.attention.output_group_count";
inline constexpr std::string_view kCompressRatios = "deepseek4.attention.compress_ratios";
inline constexpr std::string_view kCompressRopeFreqBase = "deepseek4.attention.compress_rope_freq_base";
inline constexpr std::string_view kSlidingWindow = "deepseek4.attention.sliding_window";
inline constexpr std::string_view kIndexerHeadCount = "deepseek4.attention.indexer.head_count";
inline constexpr std::string_view kIndexerKeyLength = "deepseek4.attention.indexer.key_length";
inline constexpr std::string_view kIndexerTopK = "deepseek4.attention.indexer.top_k";
inline constexpr std::string_view kRmsEps = "deepseek4.attention.layer_norm_rms_epsilon";
inline constexpr std::string_view kExpertCount = "deepseek4.expert_count";
inline constexpr std::string_view kExpertUsedCount = "deepseek4.expert_used_count";
inline constexpr std::string_view kExpertSharedCount = "deepseek4.expert_shared_count";
inline constexpr std::string_view kExpertFeedForwardLength = "deepseek4.expert_feed_forward_length";
inline constexpr std::string_view kExpertWeightsScale = "deepseek4.expert_weights_scale";
inline constexpr std::string_view kExpertWeightsNorm = "deepseek4.expert_weights_norm";
inline constexpr std::string_view kExpertGroupCount = "deepseek4.expert_group_count";
inline constexpr std::string_view kExpertGroupUsedCount = "deepseek4.expert_group_used_count";
inline constexpr std::string_view kHashLayerCount = "deepseek4.hash_layer_count";
inline constexpr std::string_view kHcCount = "deepseek4.hyper_connection.count";
inline constexpr std::string_view kHcSinkhornIterations = "deepseek4.hyper_connection.sinkhorn_iterations";
inline constexpr std::string_view kHcEpsilon = "deepseek4.hyper_connection.epsilon";
inline constexpr std::string_view kSwigluClampExp = "deepseek4.swiglu_clamp_exp";
inline constexpr std::string_view kRopeFreqBase = "deepseek4.rope.freq_base";
inline constexpr std::string_view kRopeScalingFactor = "deepseek4.rope.scaling.factor";
inline constexpr std::string_view kRopeScalingOrigCtx = "deepseek4.rope.scaling.original_context_length";
inline constexpr std::string_view kRopeYarnBetaFast = "deepseek4.rope.scaling.yarn_beta_fast";
inline constexpr std::string_view kRopeYarnBetaSlow = "deepseek4.rope.scaling.yarn_beta_slow";
inline constexpr std::string_view kNextnPredictLayers = "deepseek4.nextn_predict_layers";
inline constexpr std::string_view kTokenizerModel = "tokenizer.ggml.model";
inline constexpr std::string_view kTokenizerPre = "tokenizer.ggml.pre";
inline constexpr std::string_view kTokenizerTokens = "tokenizer.ggml.tokens";
inline constexpr std::string_view kTokenizerTokenType = "tokenizer.ggml.token_type";
inline constexpr std::string_view kTokenizerMerges = "tokenizer.ggml.merges";
inline constexpr std::string_view kTokenizerBos = "tokenizer.ggml.bos_token_id";
inline constexpr std::string_view kTokenizerEos = "tokenizer.ggml.eos_token_id";
inline constexpr std::string_view kChatTemplate = "tokenizer.chat_template";
}  // namespace dsv4_key

struct Dsv4GgufName {
  enum class Kind {
    kTensor,          // one HF tensor is one GGUF tensor
    kExpertSlice,     // HF expert `expert` is slice [.., .., expert] of a stacked tensor
    kScaleCompanion,  // HF ".scale" of the weight whose GGUF name is `gguf`
  };
  std::string gguf;
  Kind kind = Kind::kTensor;
  int expert = -1;  // kExpertSlice (and expert scale companions): the expert index
};

// HF official name (with or without a leading "model.") → GGUF; nullopt if unknown.
std::optional<Dsv4GgufName> dsv4_gguf_name(std::string_view hf_name);

// GGUF name → HF official name. Stacked expert tensors need `expert` (>= 0) and give that
// expert's weight name; nullopt for unknown names or a missing/extra expert index.
std::optional<std::string> dsv4_hf_name(std::string_view gguf_name, int expert = -1);

}  // namespace aff::format
