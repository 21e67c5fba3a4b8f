#include "model/dsv4/weights_bind.h"

#include <cstring>

#include <fmt/format.h>

namespace aff::dsv4 {

namespace {

// ---- the layout -----------------------------------------------------------

struct Walker {
  const ModelConfig& c;
  LayoutVisitor& v;

  int64_t D() const { return c.hidden_size; }

  Status hc(const std::string& prefix, const std::string& site, HcWeights* dst) {
    const int64_t hc = c.hc_mult;
    const int64_t mix = (2 + hc) * hc;  // pre (hc) + post (hc) + comb (hc*hc)
    AFF_RETURN_IF_ERROR(v.tensor(prefix + site + "_fn", TensorKind::kF32, {mix, hc * D()}, &dst->fn));
    AFF_RETURN_IF_ERROR(v.tensor(prefix + site + "_base", TensorKind::kF32, {mix}, &dst->base));
    return v.tensor(prefix + site + "_scale", TensorKind::kF32, {3}, &dst->scale);
  }

  // The final collapse of the streams: one weight per stream.
  Status hc_head(const std::string& prefix, HcWeights* dst) {
    const int64_t hc = c.hc_mult;
    AFF_RETURN_IF_ERROR(v.tensor(prefix + "hc_head_fn", TensorKind::kF32, {hc, hc * D()}, &dst->fn));
    AFF_RETURN_IF_ERROR(v.tensor(prefix + "hc_head_base", TensorKind::kF32, {hc}, &dst->base));
    return v.tensor(prefix + "hc_head_scale", TensorKind::kF32, {1}, &dst->scale);
  }

  Status linear(const std::string& stem, int64_t out, int64_t in, LinearKind kind, Linear* dst) {
    dst->out = out;
    dst->in = in;
    dst->block = c.weight_block;
    return v.linear(stem, out, in, kind, dst);
  }

  // Ratio-4 compressors pool overlapping windows and so project to 2*d.
  Status compressor(const std::string& prefix, int ratio, int dim, CompressorWeights* dst) {
    dst->present = true;
    dst->ratio = ratio;
    dst->dim = dim;
    dst->overlap = ratio == 4;
    const int64_t cd = int64_t(dst->overlap ? 2 : 1) * dim;
    AFF_RETURN_IF_ERROR(linear(prefix + "wkv", cd, D(), LinearKind::kPlain, &dst->wkv));
    AFF_RETURN_IF_ERROR(linear(prefix + "wgate", cd, D(), LinearKind::kPlain, &dst->wgate));
    AFF_RETURN_IF_ERROR(v.tensor(prefix + "ape", TensorKind::kF32, {ratio, cd}, &dst->ape));
    return v.tensor(prefix + "norm.weight", TensorKind::kNormWeight, {dim}, &dst->norm);
  }

  Status attention(const std::string& p, int ratio, AttentionWeights* a) {
    const int64_t H = c.num_heads, Dh = c.head_dim, G = c.o_groups;
    AFF_RETURN_IF_ERROR(linear(p + "wq_a", c.q_lora_rank, D(), LinearKind::kDense, &a->wq_a));
    AFF_RETURN_IF_ERROR(v.tensor(p + "q_norm.weight", TensorKind::kNormWeight, {c.q_lora_rank}, &a->q_norm));
    AFF_RETURN_IF_ERROR(linear(p + "wq_b", H * Dh, c.q_lora_rank, LinearKind::kDense, &a->wq_b));
    AFF_RETURN_IF_ERROR(linear(p + "wkv", Dh, D(), LinearKind::kDense, &a->wkv));
    AFF_RETURN_IF_ERROR(v.tensor(p + "kv_norm.weight", TensorKind::kNormWeight, {Dh}, &a->kv_norm));
    AFF_RETURN_IF_ERROR(linear(p + "wo_a", G * c.o_lora_rank, (H / G) * Dh, LinearKind::kDense, &a->wo_a));
    AFF_RETURN_IF_ERROR(linear(p + "wo_b", D(), G * c.o_lora_rank, LinearKind::kDense, &a->wo_b));
    AFF_RETURN_IF_ERROR(v.tensor(p + "attn_sink", TensorKind::kF32, {H}, &a->attn_sink));
    if (ratio != 0) AFF_RETURN_IF_ERROR(compressor(p + "compressor.", ratio, c.head_dim, &a->compressor));
    if (ratio == 4) {
      IndexerWeights* ix = &a->indexer;
      ix->present = true;
      const std::string q = p + "indexer.";
      AFF_RETURN_IF_ERROR(linear(q + "wq_b", int64_t(c.index_n_heads) * c.index_head_dim, c.q_lora_rank,
                                 LinearKind::kDense, &ix->wq_b));
      AFF_RETURN_IF_ERROR(linear(q + "weights_proj", c.index_n_heads, D(), LinearKind::kPlain, &ix->weights_proj));
      AFF_RETURN_IF_ERROR(compressor(q + "compressor.", 4, c.index_head_dim, &ix->compressor));
    }
    return Status::ok();
  }

  Status expert(const std::string& p, LinearKind kind, ExpertWeights* e) {
    AFF_RETURN_IF_ERROR(linear(p + "w1", c.moe_inter, D(), kind, &e->w1));
    AFF_RETURN_IF_ERROR(linear(p + "w2", D(), c.moe_inter, kind, &e->w2));
    return linear(p + "w3", c.moe_inter, D(), kind, &e->w3);
  }

  Status moe(const std::string& p, bool hash, MoeWeights* m) {
    const int64_t E = c.n_routed_experts;
    AFF_RETURN_IF_ERROR(linear(p + "gate", E, D(), LinearKind::kPlain, &m->gate));
    if (hash) {
      AFF_RETURN_IF_ERROR(v.tensor(p + "gate.tid2eid", TensorKind::kExpertIds, {c.vocab_size, c.n_experts_per_tok},
                                   &m->tid2eid));
    } else {
      AFF_RETURN_IF_ERROR(v.tensor(p + "gate.bias", TensorKind::kF32, {E}, &m->gate_bias));
    }
    m->experts.resize(size_t(E));
    for (int64_t e = 0; e < E; ++e) {
      AFF_RETURN_IF_ERROR(expert(fmt::format("{}experts.{}.", p, e), LinearKind::kExpert, &m->experts[size_t(e)]));
    }
    m->has_shared = c.n_shared_experts == 1;
    if (m->has_shared) AFF_RETURN_IF_ERROR(expert(p + "shared_experts.", LinearKind::kDense, &m->shared));
    return Status::ok();
  }

  // One block (main layer, MTP block or DSpark stage). `layer` indexes
  // compress_ratios; hash routing applies to layers below num_hash_layers.
  Status block(const std::string& p, int layer, LayerWeights* l) {
    l->index = layer;
    const int ratio = c.compress_ratio(layer);
    AFF_RETURN_IF_ERROR(hc(p, "hc_attn", &l->hc_attn));
    AFF_RETURN_IF_ERROR(hc(p, "hc_ffn", &l->hc_ffn));
    AFF_RETURN_IF_ERROR(v.tensor(p + "attn_norm.weight", TensorKind::kNormWeight, {D()}, &l->attn_norm));
    AFF_RETURN_IF_ERROR(v.tensor(p + "ffn_norm.weight", TensorKind::kNormWeight, {D()}, &l->ffn_norm));
    AFF_RETURN_IF_ERROR(attention(p + "attn.", ratio, &l->attn));
    return moe(p + "ffn.", c.is_hash_layer(layer), &l->ffn);
  }

  Status model(ModelWeights* w) {
    AFF_RETURN_IF_ERROR(v.tensor("embed.weight", TensorKind::kNormWeight, {c.vocab_size, D()}, &w->embed));
    AFF_RETURN_IF_ERROR(linear("head", c.vocab_size, D(), LinearKind::kPlain, &w->head));
    AFF_RETURN_IF_ERROR(v.tensor("norm.weight", TensorKind::kNormWeight, {D()}, &w->norm));
    AFF_RETURN_IF_ERROR(hc_head("", &w->hc_head));
    w->layers.resize(size_t(c.num_layers));
    for (int l = 0; l < c.num_layers; ++l) {
      AFF_RETURN_IF_ERROR(block(fmt::format("layers.{}.", l), l, &w->layers[size_t(l)]));
    }
    // MTP blocks share embed and head with the main model (not stored again).
    w->mtp.resize(size_t(c.num_mtp_layers));
    for (int n = 0; n < c.num_mtp_layers; ++n) {
      const std::string p = fmt::format("mtp.{}.", n);
      MtpWeights* m = &w->mtp[size_t(n)];
      AFF_RETURN_IF_ERROR(linear(p + "e_proj", D(), D(), LinearKind::kDense, &m->e_proj));
      AFF_RETURN_IF_ERROR(linear(p + "h_proj", D(), D(), LinearKind::kDense, &m->h_proj));
      AFF_RETURN_IF_ERROR(v.tensor(p + "enorm.weight", TensorKind::kNormWeight, {D()}, &m->enorm));
      AFF_RETURN_IF_ERROR(v.tensor(p + "hnorm.weight", TensorKind::kNormWeight, {D()}, &m->hnorm));
      AFF_RETURN_IF_ERROR(v.tensor(p + "norm.weight", TensorKind::kNormWeight, {D()}, &m->norm));
      AFF_RETURN_IF_ERROR(hc_head(p, &m->hc_head));
      AFF_RETURN_IF_ERROR(block(p, c.num_layers + n, &m->block));
    }
    const int S = c.num_dspark_stages;
    DsparkWeights* d = &w->dspark;
    d->stages.resize(size_t(S));
    if (S > 0) {
      const int64_t targets = int64_t(c.dspark_target_layer_ids.size());
      AFF_RETURN_IF_ERROR(linear("mtp.0.main_proj", D(), D() * targets, LinearKind::kDense, &d->main_proj));
      AFF_RETURN_IF_ERROR(v.tensor("mtp.0.main_norm.weight", TensorKind::kNormWeight, {D()}, &d->main_norm));
      for (int s = 0; s < S; ++s) {
        AFF_RETURN_IF_ERROR(block(fmt::format("mtp.{}.", s), c.num_layers + s, &d->stages[size_t(s)]));
      }
      const std::string last = fmt::format("mtp.{}.", S - 1);
      const int64_t rank = c.dspark_markov_rank;
      AFF_RETURN_IF_ERROR(v.tensor(last + "norm.weight", TensorKind::kNormWeight, {D()}, &d->norm));
      AFF_RETURN_IF_ERROR(hc_head(last, &d->hc_head));
      AFF_RETURN_IF_ERROR(v.tensor(last + "markov_head.markov_w1.weight", TensorKind::kNormWeight,
                                   {c.vocab_size, rank}, &d->markov_w1));
      AFF_RETURN_IF_ERROR(linear(last + "markov_head.markov_w2", c.vocab_size, rank, LinearKind::kPlain,
                                 &d->markov_w2));
      AFF_RETURN_IF_ERROR(linear(last + "confidence_head.proj", 1, D() + rank, LinearKind::kPlain,
                                 &d->confidence_proj));
    }
    return Status::ok();
  }
};

// ---- binding --------------------------------------------------------------

bool is_plain_float(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

WeightFormat plain_format(DType t) {
  switch (t) {
    case DType::kF32: return WeightFormat::kF32;
    case DType::kF16: return WeightFormat::kF16;
    default: return WeightFormat::kBF16;
  }
}

class Binder final : public LayoutVisitor {
 public:
  Binder(const ModelConfig& c, const format::TensorIndex& index) : c_(c), index_(index) {}

  Status linear(const std::string& stem, int64_t out, int64_t in, LinearKind kind, Linear* dst) override {
    AFF_ASSIGN_OR_RETURN(TensorView w, index_.get(stem + ".weight"));
    const bool expert = kind == LinearKind::kExpert;
    const std::string& ed = c_.expert_dtype;
    const bool plain_ok = kind != LinearKind::kExpert || ed.empty();
    const bool fp8_ok = kind == LinearKind::kDense || (expert && (ed.empty() || ed == "fp8"));
    const bool fp4_ok = expert && (ed.empty() || ed == "fp4");

    if (is_plain_float(w.dtype) && plain_ok) {
      AFF_RETURN_IF_ERROR(expect_shape(w, {out, in}));
      dst->weight = w;
      dst->format = plain_format(w.dtype);
      return Status::ok();
    }
    if (w.dtype == DType::kF8E4M3 && fp8_ok) {
      AFF_RETURN_IF_ERROR(expect_shape(w, {out, in}));
      AFF_ASSIGN_OR_RETURN(TensorView s, scale_of(stem, w));
      AFF_RETURN_IF_ERROR(expect_dtype(s, DType::kF8E8M0));
      AFF_RETURN_IF_ERROR(expect_shape(s, fp8_scale_shape(out, in, c_.weight_block)));
      dst->weight = w;
      dst->scale = s;
      dst->format = WeightFormat::kFP8Block;
      return Status::ok();
    }
    if (w.dtype == DType::kI8 && fp4_ok) {
      if (in % 32 != 0) {
        return corrupt(fmt::format("{}: tensor '{}': packed MXFP4 needs a row length divisible by 32, the layout "
                                   "says {}", w.file, w.name, in));
      }
      AFF_RETURN_IF_ERROR(expect_shape(w, {out, in / 2}));
      AFF_ASSIGN_OR_RETURN(TensorView s, scale_of(stem, w));
      AFF_RETURN_IF_ERROR(expect_dtype(s, DType::kF8E8M0));
      AFF_RETURN_IF_ERROR(expect_shape(s, {out, in / 32}));
      dst->weight = w;
      dst->scale = s;
      dst->format = WeightFormat::kMXFP4;
      return Status::ok();
    }
    std::string allowed;
    if (plain_ok) allowed = "F32, BF16 or F16";
    if (fp8_ok) allowed += std::string(allowed.empty() ? "" : ", or ") + "F8_E4M3 with an F8_E8M0 .scale";
    if (fp4_ok) allowed += std::string(allowed.empty() ? "" : ", or ") + "I8 (packed MXFP4) with an F8_E8M0 .scale";
    std::string why = expert && !ed.empty() ? fmt::format(" for expert_dtype '{}'", ed) : "";
    return corrupt(fmt::format("{}: tensor '{}': dtype {} is not allowed here{} (expected {})", w.file, w.name,
                               dtype_name(w.dtype), why, allowed));
  }

  Status tensor(const std::string& name, TensorKind kind, const std::vector<int64_t>& shape,
                TensorView* dst) override {
    AFF_ASSIGN_OR_RETURN(TensorView t, index_.get(name));
    switch (kind) {
      case TensorKind::kNormWeight:
        if (t.dtype != DType::kBF16 && t.dtype != DType::kF32) return bad_dtype(t, "BF16 or F32");
        break;
      case TensorKind::kF32:
        if (t.dtype != DType::kF32) return bad_dtype(t, "F32");
        break;
      case TensorKind::kExpertIds:
        if (t.dtype != DType::kI64 && t.dtype != DType::kI32) return bad_dtype(t, "I64 or I32");
        break;
    }
    AFF_RETURN_IF_ERROR(expect_shape(t, shape));
    if (kind == TensorKind::kExpertIds) AFF_RETURN_IF_ERROR(check_expert_ids(t));
    *dst = t;
    return Status::ok();
  }

 private:
  Result<TensorView> scale_of(const std::string& stem, const TensorView& w) const {
    const std::string name = stem + ".scale";
    if (const TensorView* s = index_.find(name)) return *s;
    return not_found(fmt::format("{}: tensor '{}' is missing (required because '{}' is {})", index_.source(), name,
                                 w.name, dtype_name(w.dtype)));
  }

  static Status bad_dtype(const TensorView& t, const char* allowed) {
    return corrupt(fmt::format("{}: tensor '{}': dtype {} is not allowed here (expected {})", t.file, t.name,
                               dtype_name(t.dtype), allowed));
  }
  static Status expect_dtype(const TensorView& t, DType want) {
    if (t.dtype == want) return Status::ok();
    return corrupt(fmt::format("{}: tensor '{}': dtype {} does not match the expected {}", t.file, t.name,
                               dtype_name(t.dtype), dtype_name(want)));
  }
  static Status expect_shape(const TensorView& t, const std::vector<int64_t>& want) {
    if (t.shape == want) return Status::ok();
    return corrupt(fmt::format("{}: tensor '{}': shape {} does not match the expected {}", t.file, t.name,
                               shape_string(t.shape), shape_string(want)));
  }

  Status check_expert_ids(const TensorView& t) const {
    if (const auto bad = find_bad_expert_id(t, c_.n_routed_experts)) {
      const int64_t K = c_.n_experts_per_tok;
      return corrupt(fmt::format("{}: tensor '{}': expert id {} at [{}, {}] is outside [0, {})", t.file, t.name,
                                 bad->id, bad->index / K, bad->index % K, c_.n_routed_experts));
    }
    return Status::ok();
  }

  const ModelConfig& c_;
  const format::TensorIndex& index_;
};

}  // namespace

Status walk_checkpoint_layout(const ModelConfig& cfg, LayoutVisitor& v, ModelWeights* w) {
  Walker walker{cfg, v};
  return walker.model(w);
}

Result<ModelWeights> bind_weights(const ModelConfig& cfg, const format::TensorIndex& index) {
  ModelWeights w;
  Binder binder(cfg, index);
  AFF_RETURN_IF_ERROR(walk_checkpoint_layout(cfg, binder, &w));
  return w;
}

std::optional<BadExpertId> find_bad_expert_id(const TensorView& t, int64_t n_experts) {
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    int64_t id;
    if (t.dtype == DType::kI64) {
      std::memcpy(&id, t.data + i * 8, 8);
    } else {
      int32_t v32;
      std::memcpy(&v32, t.data + i * 4, 4);
      id = v32;
    }
    if (id < 0 || id >= n_experts) return BadExpertId{i, id};
  }
  return std::nullopt;
}

}  // namespace aff::dsv4
