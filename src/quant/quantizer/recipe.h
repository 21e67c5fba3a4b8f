// Quantisation recipes: which ggml type each tensor of a DeepSeek-V4 container gets.
// A tensor's type comes from its role (routed expert gate/up/down, dense projection,
// output head, embedding, router/compressor/indexer, small F32 parameter, expert ids),
// then user rules `PATTERN=TYPE` (glob over GGUF names, last match wins), then a
// block-size fallback when the row length is not a multiple of the type's block.
//
// Recipes (experts | everything else):
//   q2    gate/up IQ2_XXS, down Q2_K   ≈ 2.25 bpw experts (the layout of the public
//                                       V4-Flash q2 GGUFs; down keeps Q2_K because its
//                                       error feeds the residual stream directly)
//   q4    Q4_K                          4.5 bpw experts
//   q8    Q8_0                          8.5 bpw experts
//   mxfp4 MXFP4                         4.25 bpw, lossless for FP4 checkpoints
// Shared by all recipes: dense projections (attention, shared expert, MTP e/h_proj) and
// the output head Q8_0; embedding, router, compressor and indexer F16 (small, and the
// router/indexer decide which experts/tokens are used at all, so they stay near-exact);
// norms, mHC parameters, sinks, ape and gate bias F32; tid2eid I32.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "affinity/status.h"
#include "quant/type_traits.h"

namespace aff::quant {

enum class TensorRole {
  kExpertGateUp,  // ffn_{gate,up}_exps
  kExpertDown,    // ffn_down_exps
  kDense,         // attention projections, shared expert, MTP projections
  kOutput,        // output.weight (lm head)
  kEmbedding,     // token_embd.weight
  kSide,          // router, compressor kv/gate, indexer q_b/proj
  kSmallF32,      // norms, mHC fn/base/scale, sinks, ape, gate bias
  kExpertIds,     // ffn_gate_tid2eid (hash routing table)
};

// Role of a deepseek4 GGUF tensor name (blk.N., mtp.K. or top-level).
TensorRole tensor_role(std::string_view gguf_name);
std::string_view tensor_role_name(TensorRole r);

struct Recipe {
  std::string name;
  GgmlType expert_gate_up = GgmlType::kQ8_0;
  GgmlType expert_down = GgmlType::kQ8_0;
  GgmlType dense = GgmlType::kQ8_0;
  GgmlType output = GgmlType::kQ8_0;
  GgmlType embedding = GgmlType::kF16;
  GgmlType side = GgmlType::kF16;
};

// "q2", "q4", "q8", "mxfp4"; invalid_argument listing the names otherwise.
Result<Recipe> recipe_by_name(std::string_view name);
std::vector<std::string_view> recipe_names();

// One --type rule. Patterns use '*' (any run) and '?' (one character) over GGUF names.
struct TypeRule {
  std::string pattern;
  GgmlType type;
};
// Parses "PATTERN=TYPE" (TYPE a ggml name such as Q4_K, case-insensitive). Only types
// affinity can quantise to are accepted.
Result<TypeRule> parse_type_rule(std::string_view spec);
bool glob_match(std::string_view pattern, std::string_view name);

struct TypeChoice {
  GgmlType type;     // what is written
  GgmlType wanted;   // what the recipe/rules asked for
  bool fell_back() const { return type != wanted; }
};

// The type of tensor `gguf_name` with row length ne0. Rules never apply to kSmallF32
// (always F32) or kExpertIds (always I32). Fallback when ne0 is not a multiple of the
// wanted type's block: Q8_0 if ne0 % 32 == 0, else F16.
TypeChoice choose_type(const Recipe& recipe, const std::vector<TypeRule>& rules, std::string_view gguf_name,
                       int64_t ne0);

}  // namespace aff::quant
