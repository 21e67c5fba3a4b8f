// The decode MoE kernels (one up launch and one down launch for every routed
// pair plus the shared expert, combine folded in) against a CPU reference made
// of exactly dequantised rows and f64 dots: routed and shared experts in
// different formats, T in {1, 2, 3, 8}, repeated expert ids, shared-only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/check/op_check.h"
#include "backend/cuda/kernels/moe/moe.h"
#include "backend/cuda/runtime/device_buffer.h"
#include "backend/cuda/runtime/device_model.h"
#include "backend/ref/linear.h"
#include "random_weights.h"
#include "gpu_test_util.h"

namespace aff::cuda {
namespace {

using quant::GgmlType;
using dsv4::WeightFormat;

// Native-format experts run in f32 (bound: float rounding); ggml experts meet
// int8 activations twice (x and the SwiGLU output), ~0.5% each, which SwiGLU
// can amplify where the gate is large next to the clamp.
constexpr double kNativeMaxRelRms = 1e-4;
constexpr double kGgmlMaxRelRms = 2.5e-2;
constexpr float kSwigluLimit = 0.6f;  // small enough that the clamp engages on these weights

struct Fmt {
  WeightFormat format;
  GgmlType ggml = GgmlType::kF32;
  bool is_ggml() const { return format == WeightFormat::kGgml; }
};

dsv4::Linear make(const Fmt& f, int64_t out, int64_t in, std::mt19937_64& rng, testing::Keep& keep) {
  return f.is_ggml() ? testing::random_ggml_linear(f.ggml, out, in, rng, keep)
                     : testing::random_native_linear(f.format, out, in, rng, keep);
}

// y = W x for one vector, W decoded exactly, f64 accumulation.
std::vector<float> ref_gemv(const dsv4::Linear& w, const float* x) {
  std::vector<float> row(size_t(w.in)), y(size_t(w.out));
  for (int64_t r = 0; r < w.out; ++r) {
    ref::linear_dequant_row(w, r, row.data());
    double s = 0.0;
    for (int64_t i = 0; i < w.in; ++i) s += double(row[size_t(i)]) * double(x[i]);
    y[size_t(r)] = float(s);
  }
  return y;
}

std::vector<float> ref_expert(const dsv4::ExpertWeights& e, const float* x) {
  std::vector<float> g = ref_gemv(e.w1, x), u = ref_gemv(e.w3, x);
  for (size_t i = 0; i < g.size(); ++i) {
    const float gc = std::min(g[i], kSwigluLimit), uc = std::clamp(u[i], -kSwigluLimit, kSwigluLimit);
    g[i] = gc / (1.0f + std::exp(-gc)) * uc;
  }
  return ref_gemv(e.w2, g.data());
}

struct Uploaded {
  DeviceArena arena;
  std::vector<ExpertSlot> host;
  DeviceBuffer table;
};

void upload_experts(const std::vector<dsv4::ExpertWeights>& ex, Uploaded& u) {
  size_t bytes = 0;
  for (const auto& e : ex) bytes += linear_device_bytes(e.w1) + linear_device_bytes(e.w2) + linear_device_bytes(e.w3);
  ASSERT_TRUE(u.arena.reserve(bytes, "experts").is_ok());
  for (const auto& e : ex) {
    ExpertSlot s;
    auto w1 = upload_linear(e.w1, u.arena), w3 = upload_linear(e.w3, u.arena), w2 = upload_linear(e.w2, u.arena);
    ASSERT_TRUE(w1.is_ok() && w2.is_ok() && w3.is_ok());
    s.w1 = *w1, s.w3 = *w3, s.w2 = *w2;
    u.host.push_back(s);
  }
  auto t = DeviceBuffer::allocate(u.host.size() * sizeof(ExpertSlot), "slots");
  ASSERT_TRUE(t.is_ok());
  u.table = std::move(t).value();
  ASSERT_TRUE(copy_to_device(u.table.data(), u.host.data(), u.host.size() * sizeof(ExpertSlot), "slots").is_ok());
}

DevFormat dev_format(const Fmt& f) {
  switch (f.format) {
    case WeightFormat::kFP8Block: return DevFormat::kFP8Block;
    case WeightFormat::kMXFP4: return DevFormat::kMXFP4;
    case WeightFormat::kBF16: return DevFormat::kBF16;
    case WeightFormat::kF32: return DevFormat::kF32;
    case WeightFormat::kF16: return DevFormat::kF16;
    case WeightFormat::kGgml: return DevFormat::kGgml;
  }
  return DevFormat::kF32;
}

struct MoeCase {
  std::string name;
  Fmt routed, shared;
  int k;            // 0: shared expert only
  bool has_shared;
};

class MoeDecodeTest : public ::testing::TestWithParam<MoeCase> {};

TEST_P(MoeDecodeTest, MatchesReference) {
  AFF_SKIP_WITHOUT_GPU();
  const MoeCase c = GetParam();
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  testing::Keep keep;
  const int64_t D = 512, I = 256;
  const int E = 5;
  std::vector<dsv4::ExpertWeights> routed(E), shared(1);
  for (auto& e : routed) {
    e.w1 = make(c.routed, I, D, rng, keep), e.w3 = make(c.routed, I, D, rng, keep);
    e.w2 = make(c.routed, D, I, rng, keep);
  }
  shared[0].w1 = make(c.shared, I, D, rng, keep), shared[0].w3 = make(c.shared, I, D, rng, keep);
  shared[0].w2 = make(c.shared, D, I, rng, keep);
  Uploaded ur, us;
  upload_experts(routed, ur);
  upload_experts(shared, us);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, E - 1);
  std::uniform_real_distribution<float> wd(0.1f, 1.5f);
  const bool ggml = c.routed.is_ggml() || c.shared.is_ggml();
  for (int64_t T : {1, 2, 3, 8}) {
    std::vector<float> x(size_t(T * D));
    for (float& v : x) v = nd(rng);
    std::vector<int32_t> ids(size_t(T * std::max(c.k, 1)));
    std::vector<float> rw(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = pick(rng), rw[i] = wd(rng);  // repeats allowed
    std::vector<float> want(size_t(T * D), 0.0f);
    for (int64_t t = 0; t < T; ++t) {
      for (int j = 0; j < c.k; ++j) {
        const std::vector<float> y = ref_expert(routed[size_t(ids[size_t(t * c.k + j)])], x.data() + t * D);
        for (int64_t d = 0; d < D; ++d) want[size_t(t * D + d)] += rw[size_t(t * c.k + j)] * y[size_t(d)];
      }
      if (c.has_shared) {
        const std::vector<float> y = ref_expert(shared[0], x.data() + t * D);
        for (int64_t d = 0; d < D; ++d) want[size_t(t * D + d)] += y[size_t(d)];
      }
    }
    auto dx = upload_vector(x, "x");
    auto dids = upload_vector(ids, "ids");
    auto drw = upload_vector(rw, "route_w");
    auto dout = upload_vector(std::vector<float>(want.size(), std::nanf("")), "out");
    MoeDecodeArgs a;
    a.slots = ur.table.as<ExpertSlot>(), a.ids = dids->as<int32_t>(), a.route_w = drw->as<float>(), a.k = c.k;
    a.routed_format = dev_format(c.routed), a.shared_format = dev_format(c.shared);
    a.routed_ggml_up = ur.host[0].w1.ggml_type, a.routed_ggml_down = ur.host[0].w2.ggml_type;
    a.shared_ggml_up = us.host[0].w1.ggml_type, a.shared_ggml_down = us.host[0].w2.ggml_type;
    a.shared_slot = c.has_shared ? us.table.as<ExpertSlot>() : nullptr;
    a.x = dx->as<float>(), a.T = T, a.D = D, a.inter = I, a.swiglu_limit = kSwigluLimit, a.out = dout->as<float>();
    auto act = DeviceBuffer::allocate(size_t(moe_decode_act_bytes(a)), "act");
    ASSERT_TRUE(dx.is_ok() && dids.is_ok() && drw.is_ok() && dout.is_ok() && act.is_ok());
    a.act = act->as<float>();
    ASSERT_TRUE(moe_decode_up(a, nullptr).is_ok());
    ASSERT_TRUE(moe_decode_down(a, nullptr).is_ok());
    auto got = download_vector(dout->as<float>(), want.size(), "out");
    ASSERT_TRUE(got.is_ok());
    EXPECT_LE(rel_rms(got->data(), want.data(), want.size()), ggml ? kGgmlMaxRelRms : kNativeMaxRelRms) << "T=" << T;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Formats, MoeDecodeTest,
    ::testing::Values(MoeCase{"Q2K_routed_FP8_shared", {WeightFormat::kGgml, GgmlType::kQ2_K}, {WeightFormat::kFP8Block}, 3, true},
                      MoeCase{"IQ2XXS_routed_BF16_shared", {WeightFormat::kGgml, GgmlType::kIQ2_XXS}, {WeightFormat::kBF16}, 3, true},
                      MoeCase{"Q3K_routed_Q4K_shared", {WeightFormat::kGgml, GgmlType::kQ3_K}, {WeightFormat::kGgml, GgmlType::kQ4_K}, 2, true},
                      MoeCase{"MXFP4_routed_FP8_shared", {WeightFormat::kMXFP4}, {WeightFormat::kFP8Block}, 6, true},
                      MoeCase{"FP8_routed_no_shared", {WeightFormat::kFP8Block}, {WeightFormat::kFP8Block}, 4, false},
                      MoeCase{"IQ4XS_routed_no_shared", {WeightFormat::kGgml, GgmlType::kIQ4_XS}, {WeightFormat::kFP8Block}, 2, false},
                      MoeCase{"shared_only_Q8_0", {WeightFormat::kFP8Block}, {WeightFormat::kGgml, GgmlType::kQ8_0}, 0, true}),
    [](const ::testing::TestParamInfo<MoeCase>& i) { return i.param.name; });

}  // namespace
}  // namespace aff::cuda
