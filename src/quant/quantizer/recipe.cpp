#include "quant/quantizer/recipe.h"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

namespace aff::quant {
namespace {

// The name without its "blk.N." / "mtp.K." prefix.
std::string_view block_suffix(std::string_view name) {
  for (std::string_view prefix : {"blk.", "mtp."}) {
    if (name.substr(0, prefix.size()) == prefix) {
      const size_t dot = name.find('.', prefix.size());
      if (dot != std::string_view::npos) return name.substr(dot + 1);
    }
  }
  return name;
}

}  // namespace

TensorRole tensor_role(std::string_view name) {
  if (name == "token_embd.weight") return TensorRole::kEmbedding;
  if (name == "output.weight") return TensorRole::kOutput;
  const std::string_view s = block_suffix(name);
  if (s == "ffn_gate_exps.weight" || s == "ffn_up_exps.weight") return TensorRole::kExpertGateUp;
  if (s == "ffn_down_exps.weight") return TensorRole::kExpertDown;
  if (s == "ffn_gate_tid2eid.weight") return TensorRole::kExpertIds;
  if (s == "ffn_gate_inp.weight" || s == "attn_compressor_kv.weight" || s == "attn_compressor_gate.weight" ||
      s == "indexer_compressor_kv.weight" || s == "indexer_compressor_gate.weight" ||
      s == "indexer.attn_q_b.weight" || s == "indexer.proj.weight") {
    return TensorRole::kSide;
  }
  if (s == "attn_q_a.weight" || s == "attn_q_b.weight" || s == "attn_kv.weight" || s == "attn_output_a.weight" ||
      s == "attn_output_b.weight" || s == "ffn_gate_shexp.weight" || s == "ffn_up_shexp.weight" ||
      s == "ffn_down_shexp.weight" || s == "e_proj.weight" || s == "h_proj.weight") {
    return TensorRole::kDense;
  }
  // Norms, hc_*, sinks, ape, exp_probs_b, output_norm/output_hc_*.
  return TensorRole::kSmallF32;
}

std::string_view tensor_role_name(TensorRole r) {
  switch (r) {
    case TensorRole::kExpertGateUp: return "expert gate/up";
    case TensorRole::kExpertDown: return "expert down";
    case TensorRole::kDense: return "dense";
    case TensorRole::kOutput: return "output";
    case TensorRole::kEmbedding: return "embedding";
    case TensorRole::kSide: return "router/compressor/indexer";
    case TensorRole::kSmallF32: return "small f32";
    case TensorRole::kExpertIds: return "expert ids";
  }
  return "?";
}

std::vector<std::string_view> recipe_names() { return {"q2", "q4", "q8", "mxfp4"}; }

Result<Recipe> recipe_by_name(std::string_view name) {
  Recipe r;
  r.name = std::string(name);
  if (name == "q2") {
    r.expert_gate_up = GgmlType::kIQ2_XXS;
    r.expert_down = GgmlType::kQ2_K;
  } else if (name == "q4") {
    r.expert_gate_up = r.expert_down = GgmlType::kQ4_K;
  } else if (name == "q8") {
    r.expert_gate_up = r.expert_down = GgmlType::kQ8_0;
  } else if (name == "mxfp4") {
    r.expert_gate_up = r.expert_down = GgmlType::kMXFP4;
  } else {
    return invalid_argument(fmt::format("unknown recipe '{}' (known: q2, q4, q8, mxfp4)", name));
  }
  return r;
}

bool glob_match(std::string_view p, std::string_view s) {
  // Iterative matcher with single backtrack point for the last '*'.
  size_t pi = 0, si = 0, star = std::string_view::npos, mark = 0;
  while (si < s.size()) {
    if (pi < p.size() && (p[pi] == '?' || p[pi] == s[si])) {
      ++pi, ++si;
    } else if (pi < p.size() && p[pi] == '*') {
      star = pi++;
      mark = si;
    } else if (star != std::string_view::npos) {
      pi = star + 1;
      si = ++mark;
    } else {
      return false;
    }
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

Result<TypeRule> parse_type_rule(std::string_view spec) {
  const size_t eq = spec.rfind('=');
  if (eq == std::string_view::npos || eq == 0 || eq + 1 == spec.size()) {
    return invalid_argument(fmt::format("--type '{}': expected PATTERN=TYPE, e.g. '*ffn_down_exps*=Q4_K'", spec));
  }
  std::string type_name(spec.substr(eq + 1));
  std::transform(type_name.begin(), type_name.end(), type_name.begin(), [](unsigned char c) { return std::toupper(c); });
  const auto type = ggml_type_from_name(type_name);
  if (!type) return invalid_argument(fmt::format("--type '{}': unknown ggml type '{}'", spec, type_name));
  if (!ggml_traits(*type).can_quantize) {
    return unsupported(fmt::format("--type '{}': affinity has no quantiser for {} (available: F32 F16 BF16 Q8_0 "
                                   "Q4_K Q3_K Q2_K IQ4_XS IQ4_NL IQ3_XXS IQ2_XS IQ2_XXS IQ1_M IQ1_S MXFP4)",
                                   spec, type_name));
  }
  return TypeRule{std::string(spec.substr(0, eq)), *type};
}

TypeChoice choose_type(const Recipe& recipe, const std::vector<TypeRule>& rules, std::string_view name,
                       int64_t ne0) {
  const TensorRole role = tensor_role(name);
  if (role == TensorRole::kSmallF32) return {GgmlType::kF32, GgmlType::kF32};
  if (role == TensorRole::kExpertIds) return {GgmlType::kI32, GgmlType::kI32};
  GgmlType want = recipe.dense;
  switch (role) {
    case TensorRole::kExpertGateUp: want = recipe.expert_gate_up; break;
    case TensorRole::kExpertDown: want = recipe.expert_down; break;
    case TensorRole::kOutput: want = recipe.output; break;
    case TensorRole::kEmbedding: want = recipe.embedding; break;
    case TensorRole::kSide: want = recipe.side; break;
    default: break;
  }
  for (const auto& r : rules) {
    if (glob_match(r.pattern, name)) want = r.type;
  }
  GgmlType type = want;
  if (ne0 % ggml_traits(want).block_elems != 0) type = ne0 % 32 == 0 ? GgmlType::kQ8_0 : GgmlType::kF16;
  return {type, want};
}

}  // namespace aff::quant
