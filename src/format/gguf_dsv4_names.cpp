#include "format/gguf_dsv4_names.h"

#include <charconv>
#include <vector>

namespace aff::format {
namespace {

struct Pair {
  std::string_view hf;
  std::string_view gguf;
};

// Whole-model tensors.
constexpr Pair kTop[] = {
    {"embed.weight", "token_embd.weight"},
    {"head.weight", "output.weight"},
    {"norm.weight", "output_norm.weight"},
    {"hc_head_fn", "output_hc_fn.weight"},
    {"hc_head_base", "output_hc_base.weight"},
    {"hc_head_scale", "output_hc_scale.weight"},
};

// Per-block suffixes: HF "layers.N.<hf>" ↔ GGUF "blk.N.<gguf>" (and "mtp.K." for both).
constexpr Pair kBlock[] = {
    {"hc_attn_fn", "hc_attn_fn.weight"},
    {"hc_attn_base", "hc_attn_base.weight"},
    {"hc_attn_scale", "hc_attn_scale.weight"},
    {"hc_ffn_fn", "hc_ffn_fn.weight"},
    {"hc_ffn_base", "hc_ffn_base.weight"},
    {"hc_ffn_scale", "hc_ffn_scale.weight"},
    {"attn_norm.weight", "attn_norm.weight"},
    {"ffn_norm.weight", "ffn_norm.weight"},
    {"attn.wq_a.weight", "attn_q_a.weight"},
    {"attn.q_norm.weight", "attn_q_a_norm.weight"},
    {"attn.wq_b.weight", "attn_q_b.weight"},
    {"attn.wkv.weight", "attn_kv.weight"},
    {"attn.kv_norm.weight", "attn_kv_a_norm.weight"},
    {"attn.wo_a.weight", "attn_output_a.weight"},
    {"attn.wo_b.weight", "attn_output_b.weight"},
    {"attn.attn_sink", "attn_sinks.weight"},
    {"attn.compressor.ape", "attn_compressor_ape.weight"},
    {"attn.compressor.wkv.weight", "attn_compressor_kv.weight"},
    {"attn.compressor.wgate.weight", "attn_compressor_gate.weight"},
    {"attn.compressor.norm.weight", "attn_compressor_norm.weight"},
    {"attn.indexer.wq_b.weight", "indexer.attn_q_b.weight"},
    {"attn.indexer.weights_proj.weight", "indexer.proj.weight"},
    {"attn.indexer.compressor.ape", "indexer_compressor_ape.weight"},
    {"attn.indexer.compressor.wkv.weight", "indexer_compressor_kv.weight"},
    {"attn.indexer.compressor.wgate.weight", "indexer_compressor_gate.weight"},
    {"attn.indexer.compressor.norm.weight", "indexer_compressor_norm.weight"},
    {"ffn.gate.weight", "ffn_gate_inp.weight"},
    {"ffn.gate.bias", "exp_probs_b.bias"},
    {"ffn.gate.tid2eid", "ffn_gate_tid2eid.weight"},
    {"ffn.shared_experts.w1.weight", "ffn_gate_shexp.weight"},
    {"ffn.shared_experts.w3.weight", "ffn_up_shexp.weight"},
    {"ffn.shared_experts.w2.weight", "ffn_down_shexp.weight"},
};

// MTP-only tensors: "mtp.K.<hf>" ↔ "mtp.K.<gguf>".
constexpr Pair kMtpOnly[] = {
    {"e_proj.weight", "e_proj.weight"},
    {"h_proj.weight", "h_proj.weight"},
    {"enorm.weight", "enorm.weight"},
    {"hnorm.weight", "hnorm.weight"},
    {"norm.weight", "norm.weight"},
    {"hc_head_fn", "hc_head_fn.weight"},
    {"hc_head_base", "hc_head_base.weight"},
    {"hc_head_scale", "hc_head_scale.weight"},
};

// Routed experts: HF "ffn.experts.E.<w>.weight" ↔ GGUF stacked "<gguf>".
constexpr Pair kExperts[] = {
    {"w1", "ffn_gate_exps.weight"},
    {"w3", "ffn_up_exps.weight"},
    {"w2", "ffn_down_exps.weight"},
};

bool consume(std::string_view& s, std::string_view prefix) {
  if (s.substr(0, prefix.size()) != prefix) return false;
  s.remove_prefix(prefix.size());
  return true;
}

// Parses "<digits>." from the front of s.
std::optional<int> consume_index(std::string_view& s) {
  int v = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p == s.data() || p == s.data() + s.size() || *p != '.' || v < 0) return std::nullopt;
  if (p - s.data() > 1 && s[0] == '0') return std::nullopt;  // no leading zeros
  s.remove_prefix(size_t(p - s.data()) + 1);
  return v;
}

// Maps the part after "layers.N." / "mtp.K." given the GGUF prefix.
std::optional<Dsv4GgufName> map_block(std::string_view rest, const std::string& gguf_prefix, bool mtp) {
  bool is_scale = false;
  std::string weight_name(rest);
  // ".scale" companions of ".weight" tensors.
  if (rest.size() > 6 && rest.substr(rest.size() - 6) == ".scale") {
    is_scale = true;
    weight_name = std::string(rest.substr(0, rest.size() - 6)) + ".weight";
  }
  std::string_view w = weight_name;
  Dsv4GgufName out;
  if (consume(w, "ffn.experts.")) {
    const auto e = consume_index(w);
    if (!e) return std::nullopt;
    for (const auto& p : kExperts) {
      if (w == std::string(p.hf) + ".weight") {
        out.gguf = gguf_prefix + std::string(p.gguf);
        out.kind = is_scale ? Dsv4GgufName::Kind::kScaleCompanion : Dsv4GgufName::Kind::kExpertSlice;
        out.expert = *e;
        return out;
      }
    }
    return std::nullopt;
  }
  auto lookup = [&](const auto& table) -> bool {
    for (const auto& p : table) {
      if (w == p.hf) {
        out.gguf = gguf_prefix + std::string(p.gguf);
        return true;
      }
    }
    return false;
  };
  if (!lookup(kBlock) && !(mtp && lookup(kMtpOnly))) return std::nullopt;
  if (is_scale) out.kind = Dsv4GgufName::Kind::kScaleCompanion;
  return out;
}

}  // namespace

std::optional<Dsv4GgufName> dsv4_gguf_name(std::string_view hf) {
  consume(hf, "model.");
  for (const auto& p : kTop) {
    if (hf == p.hf) return Dsv4GgufName{std::string(p.gguf)};
  }
  std::string_view rest = hf;
  if (consume(rest, "layers.")) {
    const auto n = consume_index(rest);
    if (!n) return std::nullopt;
    return map_block(rest, "blk." + std::to_string(*n) + ".", false);
  }
  if (consume(rest, "mtp.")) {
    const auto k = consume_index(rest);
    if (!k) return std::nullopt;
    return map_block(rest, "mtp." + std::to_string(*k) + ".", true);
  }
  return std::nullopt;
}

std::optional<std::string> dsv4_hf_name(std::string_view gguf, int expert) {
  for (const auto& p : kTop) {
    if (gguf == p.gguf) return expert < 0 ? std::optional<std::string>(std::string(p.hf)) : std::nullopt;
  }
  std::string_view rest = gguf;
  std::string hf_prefix;
  bool mtp = false;
  if (consume(rest, "blk.")) {
    const auto n = consume_index(rest);
    if (!n) return std::nullopt;
    hf_prefix = "layers." + std::to_string(*n) + ".";
  } else if (consume(rest, "mtp.")) {
    const auto k = consume_index(rest);
    if (!k) return std::nullopt;
    hf_prefix = "mtp." + std::to_string(*k) + ".";
    mtp = true;
  } else {
    return std::nullopt;
  }
  for (const auto& p : kExperts) {
    if (rest == p.gguf) {
      if (expert < 0) return std::nullopt;
      return hf_prefix + "ffn.experts." + std::to_string(expert) + "." + std::string(p.hf) + ".weight";
    }
  }
  if (expert >= 0) return std::nullopt;
  for (const auto& p : kBlock) {
    if (rest == p.gguf) return hf_prefix + std::string(p.hf);
  }
  if (mtp) {
    for (const auto& p : kMtpOnly) {
      if (rest == p.gguf) return hf_prefix + std::string(p.hf);
    }
  }
  return std::nullopt;
}

}  // namespace aff::format
