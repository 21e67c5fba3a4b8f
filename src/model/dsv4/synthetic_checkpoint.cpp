#include "model/dsv4/synthetic_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "format/safetensors_writer.h"
#include "format/tensor_index.h"
#include "model/dsv4/config_json.h"

namespace aff::dsv4 {

namespace {

// splitmix64: tiny, portable and identical everywhere (std distributions are not).
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [-1, 1).
  float sym() { return float(double(next() >> 11) * 0x1.0p-53 * 2.0 - 1.0); }
};

Rng rng_for(uint64_t seed, const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a of the name, then mixed with the seed
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001b3ull;
  Rng r{h ^ (seed * 0x9e3779b97f4a7c15ull)};
  r.next();
  return r;
}

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

// Power-of-two scale exponent so that amax / 2^e <= limit (the ue8m0 rule).
int pow2_exponent(float amax, float limit) {
  if (!(amax > 0.0f)) return -127;
  int e = int(std::ceil(std::log2(double(amax) / double(limit))));
  return std::clamp(e, -127, 127);
}

void put_f32(std::vector<uint8_t>* out, size_t i, float v) { std::memcpy(out->data() + 4 * i, &v, 4); }

// Linear weights have std 1/sqrt(in) so random models keep activations O(1).
std::vector<float> linear_values(Rng& r, int64_t out, int64_t in) {
  const float a = std::sqrt(3.0f / float(in));
  std::vector<float> v(size_t(out * in));
  for (float& x : v) x = a * r.sym();
  return v;
}

std::vector<SyntheticTensor> make_linear(const ModelConfig& cfg, const SyntheticUnit& u, Rng& r) {
  const int64_t out = u.shape[0], in = u.shape[1];
  const std::vector<float> w = linear_values(r, out, in);
  std::vector<SyntheticTensor> t;
  const std::string wname = u.name + ".weight", sname = u.name + ".scale";
  switch (u.format) {
    case WeightFormat::kF32: {
      std::vector<uint8_t> b(w.size() * 4);
      for (size_t i = 0; i < w.size(); ++i) put_f32(&b, i, w[i]);
      t.push_back({wname, DType::kF32, {out, in}, std::move(b)});
      break;
    }
    case WeightFormat::kBF16:
    case WeightFormat::kF16: {
      const bool bf = u.format == WeightFormat::kBF16;
      std::vector<uint8_t> b(w.size() * 2);
      for (size_t i = 0; i < w.size(); ++i) {
        const uint16_t h = bf ? f32_to_bf16(w[i]) : f32_to_f16(w[i]);
        std::memcpy(b.data() + 2 * i, &h, 2);
      }
      t.push_back({wname, bf ? DType::kBF16 : DType::kF16, {out, in}, std::move(b)});
      break;
    }
    case WeightFormat::kFP8Block: {
      const int B = cfg.weight_block;
      const auto ss = fp8_scale_shape(out, in, B);
      std::vector<uint8_t> q(size_t(out * in)), s(size_t(ss[0] * ss[1]));
      for (int64_t bo = 0; bo < ss[0]; ++bo) {
        for (int64_t bi = 0; bi < ss[1]; ++bi) {
          const int64_t r0 = bo * B, r1 = std::min(out, r0 + B), c0 = bi * B, c1 = std::min(in, c0 + B);
          float amax = 0.0f;
          for (int64_t i = r0; i < r1; ++i)
            for (int64_t j = c0; j < c1; ++j) amax = std::max(amax, std::fabs(w[size_t(i * in + j)]));
          const int e = pow2_exponent(amax, 448.0f);
          s[size_t(bo * ss[1] + bi)] = uint8_t(e + 127);
          const float inv = std::ldexp(1.0f, -e);
          for (int64_t i = r0; i < r1; ++i)
            for (int64_t j = c0; j < c1; ++j) q[size_t(i * in + j)] = f32_to_e4m3(w[size_t(i * in + j)] * inv);
        }
      }
      t.push_back({wname, DType::kF8E4M3, {out, in}, std::move(q)});
      t.push_back({sname, DType::kF8E8M0, ss, std::move(s)});
      break;
    }
    case WeightFormat::kMXFP4: {
      std::vector<uint8_t> q(size_t(out * in / 2)), s(size_t(out * in / 32));
      for (int64_t i = 0; i < out; ++i) {
        for (int64_t b = 0; b < in / 32; ++b) {
          const float* x = &w[size_t(i * in + b * 32)];
          float amax = 0.0f;
          for (int k = 0; k < 32; ++k) amax = std::max(amax, std::fabs(x[k]));
          const int e = pow2_exponent(amax, 6.0f);
          s[size_t(i * (in / 32) + b)] = uint8_t(e + 127);
          const float inv = std::ldexp(1.0f, -e);
          for (int k = 0; k < 32; k += 2) {
            // Low nibble holds the even element.
            const uint8_t lo = f32_to_e2m1(x[k] * inv), hi = f32_to_e2m1(x[k + 1] * inv);
            q[size_t(i * (in / 2) + b * 16 + k / 2)] = uint8_t(lo | (hi << 4));
          }
        }
      }
      t.push_back({wname, DType::kI8, {out, in / 2}, std::move(q)});
      t.push_back({sname, DType::kF8E8M0, {out, in / 32}, std::move(s)});
      break;
    }
    case WeightFormat::kGgml:
      AFF_CHECK(false);  // the planner gives checkpoint units the official formats only
      break;
  }
  return t;
}

SyntheticTensor make_tensor(const ModelConfig& cfg, const SyntheticUnit& u, Rng& r) {
  SyntheticTensor t{u.name, u.dtype, u.shape, {}};
  int64_t n = 1;
  for (int64_t d : u.shape) n *= d;
  if (u.kind == TensorKind::kExpertIds) {
    // Each token row routes to distinct experts (a partial Fisher-Yates draw).
    const int64_t K = u.shape[1], E = cfg.n_routed_experts;
    t.bytes.resize(size_t(n * 8));
    std::vector<int64_t> perm(static_cast<size_t>(E));
    for (int64_t row = 0; row < u.shape[0]; ++row) {
      for (int64_t e = 0; e < E; ++e) perm[size_t(e)] = e;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t j = k + int64_t(r.next() % uint64_t(E - k));
        std::swap(perm[size_t(k)], perm[size_t(j)]);
        std::memcpy(t.bytes.data() + 8 * size_t(row * K + k), &perm[size_t(k)], 8);
      }
    }
    return t;
  }
  // Norm weights near 1; embeddings and other tables O(1); F32 matrices
  // (mHC fn) scaled by their width, vectors (bases, sinks, biases) small.
  std::vector<float> v(static_cast<size_t>(n));
  const bool norm = ends_with(u.name, "norm.weight");
  const float a = u.kind == TensorKind::kNormWeight ? (norm ? 0.1f : 1.0f)
                  : u.shape.size() >= 2              ? 1.0f / std::sqrt(float(u.shape.back()))
                                                     : 0.5f;
  for (float& x : v) x = (norm ? 1.0f : 0.0f) + a * r.sym();
  t.bytes.resize(size_t(n * dtype_size(u.dtype)));
  for (size_t i = 0; i < v.size(); ++i) {
    if (u.dtype == DType::kF32) {
      put_f32(&t.bytes, i, v[i]);
    } else {
      const uint16_t h = f32_to_bf16(v[i]);
      std::memcpy(t.bytes.data() + 2 * i, &h, 2);
    }
  }
  return t;
}

// Collects the layout as units, choosing the official storage for each.
class Planner final : public LayoutVisitor {
 public:
  explicit Planner(const ModelConfig& c) : c_(c) {}
  std::vector<SyntheticUnit> units;

  Status linear(const std::string& stem, int64_t out, int64_t in, LinearKind kind, Linear*) override {
    SyntheticUnit u;
    u.name = stem;
    u.is_linear = true;
    u.shape = {out, in};
    const WeightFormat dense = c_.fp8_dense ? WeightFormat::kFP8Block : WeightFormat::kBF16;
    switch (kind) {
      case LinearKind::kPlain: u.format = WeightFormat::kBF16; break;
      case LinearKind::kDense: u.format = dense; break;
      case LinearKind::kExpert:
        u.format = c_.expert_dtype == "fp4"   ? WeightFormat::kMXFP4
                   : c_.expert_dtype == "fp8" ? WeightFormat::kFP8Block
                                              : dense;
        break;
    }
    const uint64_t n = uint64_t(out * in);
    switch (u.format) {
      case WeightFormat::kF32: u.stored_bytes = 4 * n; break;
      case WeightFormat::kBF16: case WeightFormat::kF16: u.stored_bytes = 2 * n; break;
      case WeightFormat::kFP8Block: {
        const auto ss = fp8_scale_shape(out, in, c_.weight_block);
        u.stored_bytes = n + uint64_t(ss[0] * ss[1]);
        break;
      }
      case WeightFormat::kMXFP4: u.stored_bytes = n / 2 + n / 32; break;
      case WeightFormat::kGgml: return internal_error("synthetic checkpoint: a ggml unit " + stem);
    }
    units.push_back(std::move(u));
    return Status::ok();
  }

  Status tensor(const std::string& name, TensorKind kind, const std::vector<int64_t>& shape, TensorView*) override {
    SyntheticUnit u;
    u.name = name;
    u.kind = kind;
    u.dtype = kind == TensorKind::kNormWeight ? DType::kBF16 : kind == TensorKind::kExpertIds ? DType::kI64 : DType::kF32;
    u.shape = shape;
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    u.stored_bytes = uint64_t(n) * uint64_t(dtype_size(u.dtype));
    units.push_back(std::move(u));
    return Status::ok();
  }

 private:
  const ModelConfig& c_;
};

}  // namespace

ModelConfig synthetic_tiny_config(Variant variant) {
  ModelConfig c;
  c.variant = variant;
  c.model_type = "deepseek_v4";
  c.vocab_size = 263;
  c.hidden_size = 160;
  c.num_layers = 5;
  c.num_heads = 4;
  c.head_dim = 64;
  c.rope_dim = 16;
  c.q_lora_rank = 48;
  c.o_groups = 2;
  c.o_lora_rank = 40;
  c.sliding_window = 16;
  c.compress_ratios = {0, 0, 4, 8, 4};
  c.rope_theta = 10000.0;
  c.compress_rope_theta = 160000.0;
  c.rope_scaling = {true, 4.0, 64, 32.0, 1.0};
  c.max_position_embeddings = 4096;
  c.index_n_heads = 4;
  c.index_head_dim = 32;
  c.index_topk = 5;
  c.n_routed_experts = 8;
  c.n_shared_experts = 1;
  c.n_experts_per_tok = 3;
  c.moe_inter = 64;
  c.num_hash_layers = 2;
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
  if (variant == Variant::kV4Flash0731) {
    c.compress_ratios.insert(c.compress_ratios.end(), {0, 0, 0});
    c.num_dspark_stages = 3;
    c.dspark_block_size = 5;
    c.dspark_noise_token_id = 257;
    c.dspark_markov_rank = 16;
    c.dspark_target_layer_ids = {2, 3, 4};
  } else {
    c.compress_ratios.push_back(0);
    c.num_mtp_layers = 1;
  }
  return c;
}

Result<std::vector<SyntheticUnit>> synthetic_checkpoint_plan(const ModelConfig& cfg) {
  AFF_RETURN_IF_ERROR(validate_config(cfg, "synthetic config"));
  Planner planner(cfg);
  ModelWeights scratch;
  AFF_RETURN_IF_ERROR(walk_checkpoint_layout(cfg, planner, &scratch));
  return std::move(planner.units);
}

std::vector<SyntheticTensor> synthetic_unit_tensors(const ModelConfig& cfg, const SyntheticUnit& unit,
                                                    uint64_t seed) {
  Rng r = rng_for(seed, unit.name);
  if (unit.is_linear) return make_linear(cfg, unit, r);
  std::vector<SyntheticTensor> out;
  out.push_back(make_tensor(cfg, unit, r));
  return out;
}

Status write_synthetic_checkpoint(const ModelConfig& cfg, const std::string& dir,
                                  const SyntheticCheckpointOptions& options) {
  namespace fs = std::filesystem;
  AFF_ASSIGN_OR_RETURN(std::vector<SyntheticUnit> units, synthetic_checkpoint_plan(cfg));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return io_error(fmt::format("{}: cannot create directory: {}", dir, ec.message()));

  {
    std::ofstream f(fs::path(dir) / "config.json", std::ios::binary);
    f << config_to_json(cfg);
    if (!f) return io_error(fmt::format("{}/config.json: write failed", dir));
  }

  // Assign whole units to shards first: shard names carry the shard count.
  std::vector<int> shard_of(units.size());
  int shards = 1;
  uint64_t fill = 0, total = 0;
  for (size_t i = 0; i < units.size(); ++i) {
    if (!options.single_file && fill > 0 && fill + units[i].stored_bytes > options.max_shard_bytes) {
      ++shards;
      fill = 0;
    }
    shard_of[i] = shards - 1;
    fill += units[i].stored_bytes;
    total += units[i].stored_bytes;
  }

  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  std::map<std::string, std::string> sorted_map;
  size_t next = 0;
  for (int s = 0; s < shards; ++s) {
    const std::string shard_name = options.single_file
                                       ? std::string(format::kSafetensorsSingleName)
                                       : fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards);
    format::SafetensorsWriter writer;
    for (; next < units.size() && shard_of[next] == s; ++next) {
      for (SyntheticTensor& t : synthetic_unit_tensors(cfg, units[next], options.seed)) {
        sorted_map[t.name] = shard_name;
        writer.add(t.name, t.dtype, std::move(t.shape), std::move(t.bytes));
      }
    }
    AFF_RETURN_IF_ERROR(writer.write((fs::path(dir) / shard_name).string()));
  }
  if (options.single_file) return Status::ok();

  for (const auto& [name, shard] : sorted_map) weight_map[name] = shard;
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = std::move(weight_map);
  std::ofstream f(fs::path(dir) / format::kSafetensorsIndexName, std::ios::binary);
  f << index.dump(2) << "\n";
  if (!f) return io_error(fmt::format("{}/{}: write failed", dir, format::kSafetensorsIndexName));
  return Status::ok();
}

}  // namespace aff::dsv4
