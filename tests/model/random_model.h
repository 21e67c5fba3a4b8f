// A random V4 model built in memory for tests: the official layout walked by
// walk_checkpoint_layout, every tensor filled with fresh random values in its
// stored format (FP8 E4M3 + E8M0 block scales for dense weights, MXFP4 for
// experts when expert_dtype == "fp4", BF16 plain weights), scaled so that
// activations stay O(1) and routing/attention are far from uniform.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/dsv4/loaded_model.h"
#include "model/dsv4/weights_bind.h"

namespace aff::dsv4::testing {

// A small config of the V4 family. ratios: one compress ratio per layer.
inline ModelConfig tiny_config(std::vector<int> ratios, int num_hash_layers) {
  ModelConfig c;
  c.model_type = "deepseek_v4";
  c.vocab_size = 97;
  c.hidden_size = 64;
  c.num_layers = int(ratios.size());
  c.num_heads = 4;
  c.head_dim = 48;
  c.rope_dim = 16;
  c.q_lora_rank = 40;
  c.o_groups = 2;
  c.o_lora_rank = 24;
  c.sliding_window = 16;
  c.compress_ratios = std::move(ratios);
  c.rope_theta = 10000.0;
  c.compress_rope_theta = 160000.0;
  c.rope_scaling.yarn = true;
  c.rope_scaling.factor = 16.0;
  c.rope_scaling.original_max_position = 65536;
  c.max_position_embeddings = 1 << 20;
  c.index_n_heads = 3;
  c.index_head_dim = 32;
  c.index_topk = 5;
  c.n_routed_experts = 6;
  c.n_shared_experts = 1;
  c.n_experts_per_tok = 2;
  c.moe_inter = 32;
  c.num_hash_layers = num_hash_layers;
  c.scoring_func = "sqrtsoftplus";
  c.routed_scaling_factor = 1.5;
  c.swiglu_limit = 10.0;
  c.rms_norm_eps = 1e-6;
  c.hc_mult = 4;
  c.hc_sinkhorn_iters = 20;
  c.hc_eps = 1e-6;
  c.fp8_dense = true;
  c.weight_block = 32;
  c.expert_dtype = "fp4";
  return c;
}

class RandomFill : public LayoutVisitor {
 public:
  RandomFill(const ModelConfig& c, uint64_t seed, std::vector<std::shared_ptr<void>>* keep)
      : c_(c), rng_(seed), keep_(keep) {}

  Status linear(const std::string& stem, int64_t out, int64_t in, LinearKind kind,
                Linear* dst) override {
    const std::string name = stem + ".weight";
    float std_dev = 1.0f / std::sqrt(float(in));
    if (stem == "head") std_dev = 2.5f / std::sqrt(float(in));
    if (stem.ends_with("ffn.gate") || stem.ends_with("wgate")) std_dev = 1.5f / std::sqrt(float(in));
    std::vector<float> w = normal(out * in, 0.0f, std_dev);
    const bool fp4 = kind == LinearKind::kExpert && c_.expert_dtype == "fp4";
    const bool fp8 = !fp4 && kind != LinearKind::kPlain && c_.fp8_dense;
    if (fp4) {
      std::vector<uint8_t> q(size_t(out * in / 2)), s(size_t(out * in / 32));
      for (int64_t r = 0; r < out; ++r)
        for (int64_t g = 0; g < in / 32; ++g) {
          const float* src = w.data() + r * in + g * 32;
          const uint8_t e = e8m0_for(amax(src, 32), 6.0f);
          s[size_t(r * (in / 32) + g)] = e;
          const float sc = e8m0_to_f32(e);
          for (int i = 0; i < 32; i += 2) {
            const uint8_t lo = f32_to_e2m1(src[i] / sc), hi = f32_to_e2m1(src[i + 1] / sc);
            q[size_t((r * in + g * 32 + i) / 2)] = uint8_t(lo | (hi << 4));
          }
        }
      dst->format = WeightFormat::kMXFP4;
      dst->weight = view(name, DType::kI8, {out, in / 2}, q.data(), q.size());
      dst->scale = view(stem + ".scale", DType::kF8E8M0, {out, in / 32}, s.data(), s.size());
    } else if (fp8) {
      const int64_t B = c_.weight_block, so = (out + B - 1) / B, si = (in + B - 1) / B;
      std::vector<uint8_t> q(size_t(out * in)), s(size_t(so * si));
      for (int64_t br = 0; br < so; ++br)
        for (int64_t bc = 0; bc < si; ++bc) {
          float m = 0.0f;
          for (int64_t r = br * B; r < std::min(out, (br + 1) * B); ++r)
            for (int64_t i = bc * B; i < std::min(in, (bc + 1) * B); ++i)
              m = std::max(m, std::fabs(w[size_t(r * in + i)]));
          const uint8_t e = e8m0_for(m, 448.0f);
          s[size_t(br * si + bc)] = e;
          const float sc = e8m0_to_f32(e);
          for (int64_t r = br * B; r < std::min(out, (br + 1) * B); ++r)
            for (int64_t i = bc * B; i < std::min(in, (bc + 1) * B); ++i)
              q[size_t(r * in + i)] = f32_to_e4m3(w[size_t(r * in + i)] / sc);
        }
      dst->format = WeightFormat::kFP8Block;
      dst->weight = view(name, DType::kF8E4M3, {out, in}, q.data(), q.size());
      dst->scale = view(stem + ".scale", DType::kF8E8M0, {so, si}, s.data(), s.size());
    } else {
      std::vector<uint16_t> b(w.size());
      for (size_t i = 0; i < w.size(); ++i) b[i] = f32_to_bf16(w[i]);
      dst->format = WeightFormat::kBF16;
      dst->weight = view(name, DType::kBF16, {out, in}, b.data(), b.size() * 2);
    }
    return Status::ok();
  }

  Status tensor(const std::string& name, TensorKind kind, const std::vector<int64_t>& shape,
                TensorView* dst) override {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    if (kind == TensorKind::kExpertIds) {  // distinct expert ids per row
      std::vector<int64_t> ids(static_cast<size_t>(n));
      std::vector<int64_t> perm(size_t(c_.n_routed_experts));
      for (int64_t r = 0; r < shape[0]; ++r) {
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng_);
        std::copy_n(perm.begin(), shape[1], ids.begin() + r * shape[1]);
      }
      *dst = view(name, DType::kI64, shape, ids.data(), ids.size() * 8);
      return Status::ok();
    }
    std::vector<float> v;
    if (name.ends_with("_fn")) v = normal(n, 0.0f, 1.0f / std::sqrt(float(shape[1])));
    else if (name.ends_with("_base")) v = normal(n, 0.0f, 0.7f);
    else if (name.ends_with("_scale")) v = uniform(n, 0.4f, 1.2f);
    else if (name.ends_with("attn_sink")) v = normal(n, 0.0f, 1.0f);
    else if (name.ends_with(".ape")) v = normal(n, 0.0f, 0.5f);
    else if (name.ends_with("gate.bias")) v = normal(n, 0.0f, 0.3f);
    else if (name == "embed.weight") v = normal(n, 0.0f, 1.0f);
    else v = normal(n, 1.0f, 0.15f);  // norm weights
    if (kind == TensorKind::kNormWeight) {
      std::vector<uint16_t> b(v.size());
      for (size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16(v[i]);
      *dst = view(name, DType::kBF16, shape, b.data(), b.size() * 2);
    } else {
      *dst = view(name, DType::kF32, shape, v.data(), v.size() * 4);
    }
    return Status::ok();
  }

 private:
  std::vector<float> normal(int64_t n, float mean, float sd) {
    std::normal_distribution<float> d(mean, sd);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = d(rng_);
    return v;
  }
  std::vector<float> uniform(int64_t n, float lo, float hi) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = d(rng_);
    return v;
  }
  static float amax(const float* p, int64_t n) {
    float m = 0.0f;
    for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(p[i]));
    return m;
  }
  // E8M0 byte of 2^ceil(log2(amax / qmax)) (the official power-of-two scale).
  static uint8_t e8m0_for(float amax, float qmax) {
    const int e = amax > 0.0f ? int(std::ceil(std::log2(double(amax) / qmax))) : -127;
    return uint8_t(std::clamp(e + 127, 1, 254));
  }
  template <typename T>
  TensorView view(const std::string& name, DType dt, std::vector<int64_t> shape, const T* src,
                  size_t nbytes) {
    auto buf = std::make_shared<std::vector<uint8_t>>(nbytes);
    std::memcpy(buf->data(), src, nbytes);
    keep_->push_back(buf);
    TensorView t;
    t.name = name;
    t.file = "<random>";
    t.dtype = dt;
    t.shape = std::move(shape);
    t.data = buf->data();
    t.nbytes = nbytes;
    return t;
  }

  const ModelConfig& c_;
  std::mt19937_64 rng_;
  std::vector<std::shared_ptr<void>>* keep_;
};

inline std::unique_ptr<LoadedModel> random_model(const ModelConfig& cfg, uint64_t seed) {
  auto m = std::make_unique<LoadedModel>();
  m->source = "<random>";
  m->config = cfg;
  RandomFill fill(m->config, seed, &m->keep_alive);
  const Status s = walk_checkpoint_layout(m->config, fill, &m->weights);
  if (!s.is_ok()) return nullptr;
  return m;
}

}  // namespace aff::dsv4::testing
