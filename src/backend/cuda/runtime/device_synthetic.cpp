#include "backend/cuda/runtime/device_synthetic.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include "backend/cuda/kernels/common/ggml_tables.h"
#include "backend/cuda/kernels/gemv/gemv.h"
#include "backend/cuda/kernels/moe/moe.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "core/dtype.h"
#include "quant/blocks.h"
#include "quant/type_traits.h"

namespace aff::cuda {

// ---- Formats

std::string SyntheticFormat::name() const {
  switch (kind) {
    case Kind::kFP8Block: return "fp8";
    case Kind::kMXFP4: return "mxfp4";
    case Kind::kBF16: return "bf16";
    case Kind::kGgml: return ggml;
  }
  return "?";
}

double SyntheticFormat::bits_per_weight() const {
  switch (kind) {
    case Kind::kFP8Block: return 8.0 + 8.0 / (128.0 * 128.0);
    case Kind::kMXFP4: return 4.25;
    case Kind::kBF16: return 16.0;
    case Kind::kGgml: {
      const auto t = quant::ggml_type_from_name(ggml);
      return t ? quant::ggml_bits_per_weight(*t) : 0.0;
    }
  }
  return 0.0;
}

Result<SyntheticFormat> parse_synthetic_format(const std::string& s) {
  std::string lower = s, upper = s;
  for (char& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
  for (char& c : upper) c = char(std::toupper(static_cast<unsigned char>(c)));
  if (lower == "fp8") return SyntheticFormat{SyntheticFormat::Kind::kFP8Block, ""};
  if (lower == "mxfp4" || lower == "fp4") return SyntheticFormat{SyntheticFormat::Kind::kMXFP4, ""};
  if (lower == "bf16") return SyntheticFormat{SyntheticFormat::Kind::kBF16, ""};
  const auto t = quant::ggml_type_from_name(upper);
  if (!t || !quant::ggml_traits(*t).quantized)
    return invalid_argument("weight format '" + s + "': expected fp8, mxfp4, bf16 or a ggml block type (Q2_K, IQ2_XXS, ...)");
  return SyntheticFormat{SyntheticFormat::Kind::kGgml, std::string(quant::ggml_type_name(*t))};
}

dsv4::ModelConfig v4_flash_config(int layers) {
  dsv4::ModelConfig c;
  c.variant = dsv4::Variant::kV4Flash;
  c.model_type = "deepseek_v4";
  c.vocab_size = 129280;
  c.hidden_size = 4096;
  c.num_layers = layers;
  c.num_mtp_layers = 0;  // the synthetic model has no MTP block (not on the decode path)
  c.num_heads = 64;
  c.head_dim = 512;
  c.rope_dim = 64;
  c.q_lora_rank = 1024;
  c.o_groups = 8;
  c.o_lora_rank = 1024;
  c.sliding_window = 128;
  // [0, 0] + [4, 128] * 20 + [4]: sliding, then CSA / HCA alternating.
  for (int l = 0; l < layers; ++l) c.compress_ratios.push_back(l < 2 ? 0 : (l % 2 == 0 ? 4 : 128));
  c.rope_theta = 10000.0;
  c.compress_rope_theta = 160000.0;
  c.rope_scaling.yarn = true;
  c.rope_scaling.factor = 16.0;
  c.rope_scaling.original_max_position = 65536;
  c.rope_scaling.beta_fast = 32.0;
  c.rope_scaling.beta_slow = 1.0;
  c.max_position_embeddings = 1048576;
  c.index_n_heads = 64;
  c.index_head_dim = 128;
  c.index_topk = 512;
  c.n_routed_experts = 256;
  c.n_shared_experts = 1;
  c.n_experts_per_tok = 6;
  c.moe_inter = 2048;
  c.num_hash_layers = std::min(3, layers);
  c.scoring_func = "sqrtsoftplus";
  c.routed_scaling_factor = 1.5;
  c.norm_topk_prob = true;
  c.swiglu_limit = 10.0;
  c.rms_norm_eps = 1e-6;
  c.hc_mult = 4;
  c.hc_sinkhorn_iters = 20;
  c.hc_eps = 1e-6;
  c.bos_token_id = 0;
  c.eos_token_id = 1;
  c.fp8_dense = true;
  c.weight_block = 128;
  c.expert_dtype = "fp4";
  return c;
}

namespace {

// A weight's device description and its byte counts, before any memory exists.
struct LinearPlan {
  DeviceLinear d;
  size_t weight_bytes = 0, scale_bytes = 0;
  SyntheticFormat fmt;
};

// dense: a dense weight, placed as upload_model places it (Q8_0 split into
// codes and scales, DevFormat::kQ8); routed experts keep the stored blocks.
Result<LinearPlan> plan_linear(const SyntheticFormat& f, int64_t out, int64_t in, const std::string& what,
                               bool dense) {
  LinearPlan p;
  p.fmt = f;
  p.d.out = out;
  p.d.in = in;
  switch (f.kind) {
    case SyntheticFormat::Kind::kFP8Block:
      p.d.format = DevFormat::kFP8Block;
      p.d.scale_type = DevScale::kE8M0;
      p.d.block = 128;
      p.d.scale_cols = (in + 127) / 128;
      p.weight_bytes = size_t(out * in);
      p.scale_bytes = size_t(((out + 127) / 128) * p.d.scale_cols);
      return p;
    case SyntheticFormat::Kind::kMXFP4:
      if (in % 32 != 0) return invalid_argument(what + ": MXFP4 row length " + std::to_string(in) + " is not a multiple of 32");
      p.d.format = DevFormat::kMXFP4;
      p.d.scale_type = DevScale::kE8M0;
      p.d.scale_cols = in / 32;
      p.weight_bytes = size_t(out * in / 2);
      p.scale_bytes = size_t(out * in / 32);
      return p;
    case SyntheticFormat::Kind::kBF16:
      p.d.format = DevFormat::kBF16;
      p.weight_bytes = size_t(out * in * 2);
      return p;
    case SyntheticFormat::Kind::kGgml: {
      const quant::GgmlType t = *quant::ggml_type_from_name(f.ggml);
      if (!ggml_type_on_device(int(t)))
        return unsupported(what + ": ggml block format " + f.ggml + " is not read by the CUDA backend");
      const auto row = quant::ggml_row_bytes(t, in);
      if (!row) return invalid_argument(what + ": row length " + std::to_string(in) + " is not a whole number of " + f.ggml + " blocks");
      if (dense && t == quant::GgmlType::kQ8_0 && in % 64 == 0) {
        p.d.format = DevFormat::kQ8;
        p.d.scale_type = DevScale::kF16;
        p.d.scale_cols = in / quant::kQK;
        p.weight_bytes = size_t(out * in);
        p.scale_bytes = size_t(out * p.d.scale_cols * 2);
        return p;
      }
      p.d.format = DevFormat::kGgml;
      p.d.ggml_type = int32_t(t);
      p.d.row_bytes = *row;
      p.weight_bytes = size_t(out * *row);
      return p;
    }
  }
  return internal_error(what + ": unknown synthetic format");
}

// Offsets of the f16 scale fields (d, and dmin where there is one) of a ggml
// block; the other bytes are small integers or sign/grid bits, valid whatever
// their value.
struct GgmlScaleFields {
  int d = -1, dmin = -1;  // -1: none (d < 0: no synthetic fill for the type)
};

GgmlScaleFields ggml_scale_fields(quant::GgmlType t) {
  using quant::GgmlType;
  switch (t) {
    case GgmlType::kQ8_0: return {int(offsetof(quant::BlockQ8_0, d)), -1};
    case GgmlType::kQ2_K: return {int(offsetof(quant::BlockQ2K, d)), int(offsetof(quant::BlockQ2K, dmin))};
    case GgmlType::kQ3_K: return {int(offsetof(quant::BlockQ3K, d)), -1};
    case GgmlType::kQ4_K: return {int(offsetof(quant::BlockQ4K, d)), int(offsetof(quant::BlockQ4K, dmin))};
    case GgmlType::kQ5_K: return {int(offsetof(quant::BlockQ5K, d)), int(offsetof(quant::BlockQ5K, dmin))};
    case GgmlType::kQ6_K: return {int(offsetof(quant::BlockQ6K, d)), -1};
    case GgmlType::kIQ4_NL: return {int(offsetof(quant::BlockIq4Nl, d)), -1};
    case GgmlType::kIQ4_XS: return {int(offsetof(quant::BlockIq4Xs, d)), -1};
    case GgmlType::kIQ2_XXS: return {int(offsetof(quant::BlockIq2Xxs, d)), -1};
    case GgmlType::kIQ2_XS: return {int(offsetof(quant::BlockIq2Xs, d)), -1};
    case GgmlType::kIQ3_XXS: return {int(offsetof(quant::BlockIq3Xxs, d)), -1};
    case GgmlType::kIQ1_S: return {int(offsetof(quant::BlockIq1S, d)), -1};
    default: return {};
  }
}

// Power-of-two block scale that brings a dot product over `in` inputs of unit
// size to about unit size, given the RMS of the stored values.
uint8_t e8m0_for(int64_t in, double stored_rms) {
  const int e = int(std::lround(std::log2(std::sqrt(double(in)) * stored_rms)));
  return uint8_t(std::clamp(127 - e, 1, 254));
}

// RMS of the stored element values: E4M3 with exponent field 0..7 (the mask
// below) and random E2M1 nibbles.
constexpr double kFp8MaskedRms = 0.6;
constexpr double kE2M1Rms = 2.9;
constexpr uint8_t kFp8Mask = 0xBF;  // clears the top exponent bit: |v| < 2, never the NaN code

// Walks the model once measuring (no device memory) and once building, with
// the same code, as the uploader does.
class Builder {
 public:
  Builder(const dsv4::ModelConfig& cfg, const SyntheticModelOptions& opt, DeviceArena* arena, cudaStream_t s)
      : cfg_(cfg), opt_(opt), arena_(arena), s_(s), seed_(opt.seed * 0x9E3779B97F4A7C15ull + 1) {}
  size_t measured() const { return bytes_; }
  const SyntheticBytes& traffic() const { return traffic_; }

  // The next n bytes; `counted`: whether a decode step reads all of them
  // (tallied in traffic().dense; experts, embedding and hash tables are
  // tallied by their callers).
  Result<uint8_t*> take(size_t n, bool counted = true) {
    if (counted) traffic_.dense += n;
    if (!arena_) {
      bytes_ += DeviceArena::aligned(n);
      return static_cast<uint8_t*>(nullptr);
    }
    AFF_ASSIGN_OR_RETURN(void* p, arena_->take(n));
    return static_cast<uint8_t*>(p);
  }
  uint64_t next_seed() { return seed_ += 0xD1B54A32D192ED03ull; }

  Result<const float*> vec(int64_t n, float amp, float offset) {
    AFF_ASSIGN_OR_RETURN(uint8_t* p, take(size_t(n) * 4));
    if (arena_) AFF_RETURN_IF_ERROR(synth_fill_f32(reinterpret_cast<float*>(p), size_t(n), next_seed(), amp, offset, s_));
    return reinterpret_cast<const float*>(p);
  }

  Result<DeviceLinear> linear(const SyntheticFormat& f, int64_t out, int64_t in, const std::string& what,
                              bool dense = true) {
    AFF_ASSIGN_OR_RETURN(LinearPlan p, plan_linear(f, out, in, what, dense));
    traffic_.dense_macs += size_t(out * in);
    AFF_ASSIGN_OR_RETURN(uint8_t* w, take(p.weight_bytes));
    uint8_t* sc = nullptr;
    if (p.scale_bytes) {
      AFF_ASSIGN_OR_RETURN(sc, take(p.scale_bytes));
    }
    p.d.weight = w;
    p.d.scale = sc;
    if (!arena_) return p.d;
    if (p.d.format == DevFormat::kQ8) {  // random codes, the ggml fill's scale (below)
      AFF_RETURN_IF_ERROR(synth_fill_bytes(w, p.weight_bytes, next_seed(), 0xFF, 0, s_));
      const float d = float(1.0 / (64.0 * std::sqrt(double(in))));
      AFF_RETURN_IF_ERROR(synth_patch_u16(sc, p.scale_bytes / 2, 2, 0, f32_to_f16(d), s_));
      return p.d;
    }
    if (f.kind == SyntheticFormat::Kind::kGgml) {
      AFF_ASSIGN_OR_RETURN(const GgmlTables* tables, ggml_device_tables());
      p.d.tables = reinterpret_cast<const uint8_t*>(tables);
    }
    switch (f.kind) {
      case SyntheticFormat::Kind::kFP8Block:
        AFF_RETURN_IF_ERROR(synth_fill_bytes(w, p.weight_bytes, next_seed(), kFp8Mask, 0, s_));
        AFF_RETURN_IF_ERROR(synth_fill_bytes(sc, p.scale_bytes, 0, 0, e8m0_for(in, kFp8MaskedRms), s_));
        break;
      case SyntheticFormat::Kind::kMXFP4:
        AFF_RETURN_IF_ERROR(synth_fill_bytes(w, p.weight_bytes, next_seed(), 0xFF, 0, s_));
        AFF_RETURN_IF_ERROR(synth_fill_bytes(sc, p.scale_bytes, 0, 0, e8m0_for(in, kE2M1Rms), s_));
        break;
      case SyntheticFormat::Kind::kBF16:
        AFF_RETURN_IF_ERROR(synth_fill_bf16(reinterpret_cast<uint16_t*>(w), size_t(out * in), next_seed(),
                                            float(std::sqrt(3.0 / double(in))), s_));
        break;
      case SyntheticFormat::Kind::kGgml: {
        const quant::GgmlType t = *quant::ggml_type_from_name(f.ggml);
        const GgmlScaleFields sf = ggml_scale_fields(t);
        if (sf.d < 0) return unsupported(what + ": no synthetic fill for ggml type " + f.ggml);
        const auto& tr = quant::ggml_traits(t);
        const size_t blocks = p.weight_bytes / size_t(tr.block_bytes);
        AFF_RETURN_IF_ERROR(synth_fill_bytes(w, p.weight_bytes, next_seed(), 0xFF, 0, s_));
        // Sub-block scales reach ~15 and quants ~3..127: a small super-scale keeps rows near unit size.
        const float d = float(1.0 / (64.0 * std::sqrt(double(in))));
        AFF_RETURN_IF_ERROR(synth_patch_u16(w, blocks, size_t(tr.block_bytes), size_t(sf.d), f32_to_f16(d), s_));
        if (sf.dmin >= 0)
          AFF_RETURN_IF_ERROR(synth_patch_u16(w, blocks, size_t(tr.block_bytes), size_t(sf.dmin), f32_to_f16(d), s_));
        break;
      }
    }
    return p.d;
  }

  // An f32 [out, in] matrix (mHC mixes) as a Linear.
  Result<DeviceLinear> f32_matrix(int64_t out, int64_t in) {
    DeviceLinear d;
    d.format = DevFormat::kF32;
    d.out = out, d.in = in;
    traffic_.dense_macs += size_t(out * in);
    AFF_ASSIGN_OR_RETURN(uint8_t* p, take(size_t(out * in) * 4));
    d.weight = p;
    if (arena_)
      AFF_RETURN_IF_ERROR(synth_fill_f32(reinterpret_cast<float*>(p), size_t(out * in), next_seed(),
                                         float(std::sqrt(3.0 / double(in))), 0.0f, s_));
    return d;
  }

  Result<DeviceHc> hc(int64_t n_mix, int n_scale) {
    DeviceHc d;
    const int64_t D = cfg_.hidden_size, hcm = cfg_.hc_mult;
    AFF_ASSIGN_OR_RETURN(d.fn, f32_matrix(n_mix, hcm * D));
    AFF_ASSIGN_OR_RETURN(d.base, vec(n_mix, 0.1f, 0.0f));
    AFF_ASSIGN_OR_RETURN(d.scale, vec(n_scale, 0.1f, 0.5f));
    return d;
  }

  Result<DeviceCompressor> compressor(int ratio, int dim) {
    DeviceCompressor c;
    c.present = true;
    c.ratio = ratio, c.dim = dim, c.overlap = ratio == 4;
    const int64_t width = (c.overlap ? 2 : 1) * int64_t(dim), D = cfg_.hidden_size;
    const SyntheticFormat bf16{SyntheticFormat::Kind::kBF16, ""};
    AFF_ASSIGN_OR_RETURN(c.wkv, linear(bf16, width, D, "compressor.wkv"));
    AFF_ASSIGN_OR_RETURN(c.wgate, linear(bf16, width, D, "compressor.wgate"));
    AFF_ASSIGN_OR_RETURN(c.ape, vec(int64_t(ratio) * width, 0.1f, 0.0f));
    AFF_ASSIGN_OR_RETURN(c.norm, vec(dim, 0.1f, 1.0f));
    return c;
  }

  // dense: the shared expert (placed as a dense weight), else a routed one.
  Result<ExpertSlot> expert(const SyntheticFormat& gate_up, const SyntheticFormat& down, bool dense) {
    const int64_t D = cfg_.hidden_size, I = cfg_.moe_inter;
    ExpertSlot s;
    AFF_ASSIGN_OR_RETURN(s.w1, linear(gate_up, I, D, "expert w1", dense));
    AFF_ASSIGN_OR_RETURN(s.w3, linear(gate_up, I, D, "expert w3", dense));
    AFF_ASSIGN_OR_RETURN(s.w2, linear(down, D, I, "expert w2", dense));
    return s;
  }

  Result<ExpertSlot*> slot_table(const std::vector<ExpertSlot>& slots) {
    AFF_ASSIGN_OR_RETURN(uint8_t* p, take(slots.size() * sizeof(ExpertSlot)));
    if (arena_) AFF_RETURN_IF_ERROR(copy_to_device(p, slots.data(), slots.size() * sizeof(ExpertSlot), "expert slot table"));
    return reinterpret_cast<ExpertSlot*>(p);
  }

  Result<DeviceMoe> moe(int layer) {
    const int64_t D = cfg_.hidden_size, E = cfg_.n_routed_experts;
    DeviceMoe m;
    const SyntheticFormat bf16{SyntheticFormat::Kind::kBF16, ""};
    AFF_ASSIGN_OR_RETURN(m.gate, linear(bf16, E, D, "ffn.gate"));
    if (cfg_.is_hash_layer(layer)) {
      const int k = cfg_.n_experts_per_tok;
      AFF_ASSIGN_OR_RETURN(uint8_t* p, take(size_t(cfg_.vocab_size) * size_t(k) * 4, /*counted=*/false));
      traffic_.dense += size_t(k) * 4;  // one row per token
      if (arena_)
        AFF_RETURN_IF_ERROR(synth_fill_tid2eid(reinterpret_cast<int32_t*>(p), cfg_.vocab_size, k, int(E), next_seed(), s_));
      m.tid2eid = reinterpret_cast<const int32_t*>(p);
    } else {
      AFF_ASSIGN_OR_RETURN(m.gate_bias, vec(E, 0.01f, 0.0f));
    }
    const int64_t pool = opt_.expert_pool > 0 ? std::min<int64_t>(opt_.expert_pool, E) : E;
    std::vector<ExpertSlot> physical(static_cast<size_t>(pool));
    const size_t dense_before = traffic_.dense, macs_before = traffic_.dense_macs;
    for (auto& s : physical) {
      AFF_ASSIGN_OR_RETURN(s, expert(opt_.expert_gate_up, opt_.expert_down, /*dense=*/false));
    }
    traffic_.expert = (traffic_.dense - dense_before) / size_t(pool);
    traffic_.expert_macs = (traffic_.dense_macs - macs_before) / size_t(pool);
    traffic_.dense = dense_before, traffic_.dense_macs = macs_before;
    m.host_slots.resize(size_t(E));
    for (int64_t e = 0; e < E; ++e) m.host_slots[size_t(e)] = physical[size_t(e % pool)];
    m.expert_format = m.host_slots[0].w1.format;
    AFF_ASSIGN_OR_RETURN(m.slots, slot_table(m.host_slots));
    m.has_shared = cfg_.n_shared_experts > 0;
    if (m.has_shared) {
      AFF_ASSIGN_OR_RETURN(ExpertSlot s, expert(opt_.dense, opt_.dense, /*dense=*/true));
      m.shared_format = s.w1.format;
      m.shared_host = s;  // the decode MoE kernels pick their compiled pair from it
      AFF_ASSIGN_OR_RETURN(m.shared_slot, slot_table({s}));
    }
    return m;
  }

  Result<DeviceAttention> attention(int layer) {
    const dsv4::ModelConfig& c = cfg_;
    const int64_t D = c.hidden_size, H = c.num_heads, Dh = c.head_dim;
    const SyntheticFormat& dense = opt_.dense;
    DeviceAttention a;
    AFF_ASSIGN_OR_RETURN(a.wq_a, linear(dense, c.q_lora_rank, D, "attn.wq_a"));
    AFF_ASSIGN_OR_RETURN(a.wq_b, linear(dense, H * Dh, c.q_lora_rank, "attn.wq_b"));
    AFF_ASSIGN_OR_RETURN(a.wkv, linear(dense, Dh, D, "attn.wkv"));
    AFF_ASSIGN_OR_RETURN(a.wo_a, linear(dense, int64_t(c.o_groups) * c.o_lora_rank, H / c.o_groups * Dh, "attn.wo_a"));
    AFF_ASSIGN_OR_RETURN(a.wo_b, linear(dense, D, int64_t(c.o_groups) * c.o_lora_rank, "attn.wo_b"));
    AFF_ASSIGN_OR_RETURN(a.q_norm, vec(c.q_lora_rank, 0.1f, 1.0f));
    AFF_ASSIGN_OR_RETURN(a.kv_norm, vec(Dh, 0.1f, 1.0f));
    AFF_ASSIGN_OR_RETURN(a.attn_sink, vec(H, 1.0f, 0.0f));
    const int ratio = c.compress_ratio(layer);
    if (ratio > 0) {
      AFF_ASSIGN_OR_RETURN(a.compressor, compressor(ratio, int(Dh)));
    }
    if (ratio == 4) {
      a.indexer.present = true;
      const SyntheticFormat bf16{SyntheticFormat::Kind::kBF16, ""};
      AFF_ASSIGN_OR_RETURN(a.indexer.wq_b, linear(dense, int64_t(c.index_n_heads) * c.index_head_dim, c.q_lora_rank,
                                                  "indexer.wq_b"));
      AFF_ASSIGN_OR_RETURN(a.indexer.weights_proj, linear(bf16, c.index_n_heads, D, "indexer.weights_proj"));
      AFF_ASSIGN_OR_RETURN(a.indexer.compressor, compressor(ratio, c.index_head_dim));
    }
    return a;
  }

  Status model(DeviceModel& out) {
    const dsv4::ModelConfig& c = cfg_;
    const int64_t D = c.hidden_size, V = c.vocab_size, hcm = c.hc_mult;
    out.embed_format = DevFormat::kBF16;
    AFF_ASSIGN_OR_RETURN(uint8_t* emb, take(size_t(V * D) * 2, /*counted=*/false));
    traffic_.embed_row = size_t(D) * 2;
    traffic_.routed_per_token = c.n_experts_per_tok;
    traffic_.layers = opt_.layers;
    // Embedding rows of about unit RMS, as a trained model's are after its first norm.
    if (arena_) AFF_RETURN_IF_ERROR(synth_fill_bf16(reinterpret_cast<uint16_t*>(emb), size_t(V * D), next_seed(), 1.7f, s_));
    out.embed = emb;
    const size_t before_head = traffic_.dense, macs_before = traffic_.dense_macs;
    AFF_ASSIGN_OR_RETURN(out.head, linear(opt_.head, V, D, "head"));
    traffic_.head = traffic_.dense - before_head;
    traffic_.head_macs = traffic_.dense_macs - macs_before;
    traffic_.dense = before_head, traffic_.dense_macs = macs_before;
    AFF_ASSIGN_OR_RETURN(out.norm, vec(D, 0.1f, 1.0f));
    AFF_ASSIGN_OR_RETURN(out.hc_head, hc(hcm, 1));
    out.layers.resize(size_t(opt_.layers));
    for (int l = 0; l < opt_.layers; ++l) {
      DeviceLayer& d = out.layers[size_t(l)];
      const int64_t n_mix = (2 + hcm) * hcm;
      AFF_ASSIGN_OR_RETURN(d.hc_attn, hc(n_mix, 3));
      AFF_ASSIGN_OR_RETURN(d.hc_ffn, hc(n_mix, 3));
      AFF_ASSIGN_OR_RETURN(d.attn_norm, vec(D, 0.1f, 1.0f));
      AFF_ASSIGN_OR_RETURN(d.ffn_norm, vec(D, 0.1f, 1.0f));
      AFF_ASSIGN_OR_RETURN(d.attn, attention(l));
      AFF_ASSIGN_OR_RETURN(d.ffn, moe(l));
    }
    return Status::ok();
  }

 private:
  const dsv4::ModelConfig& cfg_;
  const SyntheticModelOptions& opt_;
  DeviceArena* arena_;
  cudaStream_t s_;
  uint64_t seed_;
  size_t bytes_ = 0;
  SyntheticBytes traffic_;
};

Status check_options(const dsv4::ModelConfig& cfg, const SyntheticModelOptions& opt) {
  if (opt.layers < 1 || opt.layers > cfg.num_layers)
    return invalid_argument("synthetic model: layers " + std::to_string(opt.layers) + " outside [1, " +
                            std::to_string(cfg.num_layers) + "]");
  if (int(cfg.compress_ratios.size()) < opt.layers)
    return invalid_argument("synthetic model: config has fewer compress_ratios than layers");
  if (opt.expert_pool < 0) return invalid_argument("synthetic model: expert pool must be >= 0");
  return Status::ok();
}

}  // namespace

Result<size_t> synthetic_model_bytes(const dsv4::ModelConfig& cfg, const SyntheticModelOptions& opt) {
  AFF_RETURN_IF_ERROR(check_options(cfg, opt));
  DeviceModel scratch;
  Builder measure(cfg, opt, nullptr, nullptr);
  AFF_RETURN_IF_ERROR(measure.model(scratch));
  return measure.measured();
}

Result<SyntheticBytes> synthetic_decode_bytes(const dsv4::ModelConfig& cfg, const SyntheticModelOptions& opt) {
  AFF_RETURN_IF_ERROR(check_options(cfg, opt));
  DeviceModel scratch;
  Builder measure(cfg, opt, nullptr, nullptr);
  AFF_RETURN_IF_ERROR(measure.model(scratch));
  return measure.traffic();
}

Result<std::unique_ptr<DeviceModel>> make_synthetic_model(const dsv4::ModelConfig& cfg,
                                                          const SyntheticModelOptions& opt) {
  AFF_ASSIGN_OR_RETURN(const size_t bytes, synthetic_model_bytes(cfg, opt));
  size_t free_b = 0, total_b = 0;
  AFF_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_b, &total_b));
  if (bytes > free_b)
    return out_of_range("synthetic model: needs " + std::to_string(bytes >> 20) + " MiB of device memory, " +
                              std::to_string(free_b >> 20) + " MiB free of " + std::to_string(total_b >> 20) +
                              " MiB (use fewer --layers, a smaller expert format or --expert-pool)");
  auto model = std::make_unique<DeviceModel>();
  model->config = cfg;
  model->config.num_layers = opt.layers;
  model->config.compress_ratios.resize(size_t(opt.layers));
  AFF_RETURN_IF_ERROR(model->arena_.reserve(bytes, "synthetic model"));
  AFF_ASSIGN_OR_RETURN(Stream stream, Stream::create());
  Builder build(model->config, opt, &model->arena_, stream.get());
  AFF_RETURN_IF_ERROR(build.model(*model));
  AFF_RETURN_IF_ERROR(stream.synchronize());
  // As upload_model: kernel attributes set now, outside any graph capture.
  AFF_RETURN_IF_ERROR(gemv_prepare());
  AFF_RETURN_IF_ERROR(moe_decode_prepare());
  return model;
}

namespace {

template <typename Buffer>  // DeviceBuffer or GrowableDeviceBuffer: only the backed bytes are filled
Status fill_buffer(const Buffer& b, uint64_t seed, cudaStream_t s) {
  return synth_fill_f32(static_cast<float*>(b.data()), b.bytes() / 4, seed, 1.0f, 0.0f, s);
}

}  // namespace

Status synthetic_fill_state(GpuState& state, int64_t n_past, uint64_t seed) {
  if (n_past < 0 || n_past > state.max_positions)
    return out_of_range("synthetic state: position " + std::to_string(n_past) + " outside the state's [0, " +
                        std::to_string(state.max_positions) + "]");
  cudaStream_t s = state.stream.get();
  uint64_t k = seed * 0x9E3779B97F4A7C15ull;
  for (size_t l = 0; l < state.layers.size(); ++l) {
    GpuLayerState& ls = state.layers[l];
    AFF_RETURN_IF_ERROR(fill_buffer(ls.window, ++k, s));
    for (GpuCompressorState* cs : {&ls.kv, &ls.idx}) {
      if (cs->entries.bytes() == 0) continue;
      AFF_RETURN_IF_ERROR(fill_buffer(cs->ring_kv, ++k, s));
      AFF_RETURN_IF_ERROR(fill_buffer(cs->ring_gate, ++k, s));
      if (cs->ring_x.bytes() > 0) AFF_RETURN_IF_ERROR(fill_buffer(cs->ring_x, k ^ 0x5bd1e995u, s));  // k unchanged: the other buffers keep their contents
      AFF_RETURN_IF_ERROR(fill_buffer(cs->entries, ++k, s));
    }
  }
  AFF_RETURN_IF_ERROR(state.stream.synchronize());
  state.n_past = n_past;
  return Status::ok();
}

}  // namespace aff::cuda
