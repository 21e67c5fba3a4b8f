// The decode MoE kernels (one up launch and one down launch for every routed
// pair plus the shared expert, combine folded in) against a CPU reference made
// of exactly dequantised rows and f64 dots: routed and shared experts in
// different formats, T in {1, 2, 3, 8}, repeated expert ids, shared-only.
// MoeDecodeFast covers the streaming kernels of the V4 layouts (ggml routed
// experts with separate gate/up and down types, FP8 shared expert) at the full
// V4 geometry and at shapes that leave lanes idle, in both MMA precisions, and
// checks that a second run gives the same bits.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/check/op_check.h"
#include "backend/cuda/kernels/common/ggml_tables.h"
#include "backend/cuda/kernels/gemm/mma_precision.h"
#include "backend/cuda/kernels/moe/moe.h"
#include "backend/cuda/kernels/moe/moe_decode_fast.h"
#include "backend/cuda/runtime/device_buffer.h"
#include "backend/cuda/runtime/device_info.h"
#include "backend/cuda/runtime/device_model.h"
#include "backend/ref/linear.h"
#include "gpu_test_util.h"
#include "random_weights.h"
#include "upload_experts.h"

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

using testing::upload_experts;
using Uploaded = testing::UploadedExperts;

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
  AFF_SEEDED_RNG(seed, rng);
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

// ---- streaming kernels (moe_decode_fast.h) ---------------------------------------------

// Bound for the FP8 shared expert alone in the fast setting (x rounded to f16
// once per projection input, ~2^-12 per element).
constexpr double kFastNativeMaxRelRms = 1e-3;

// An expert's three weights dequantised once (f32, row-major), for shapes where
// re-decoding every row per pair would dominate the test.
struct RefMats {
  int64_t D = 0, I = 0;
  std::vector<float> w1, w3, w2;  // [I, D], [I, D], [D, I]
};

RefMats dequant(const dsv4::ExpertWeights& e) {
  RefMats r;
  r.D = e.w1.in, r.I = e.w1.out;
  r.w1.resize(size_t(r.I * r.D)), r.w3.resize(size_t(r.I * r.D)), r.w2.resize(size_t(r.D * r.I));
  for (int64_t i = 0; i < r.I; ++i) {
    ref::linear_dequant_row(e.w1, i, r.w1.data() + i * r.D);
    ref::linear_dequant_row(e.w3, i, r.w3.data() + i * r.D);
  }
  for (int64_t d = 0; d < r.D; ++d) ref::linear_dequant_row(e.w2, d, r.w2.data() + d * r.I);
  return r;
}

std::vector<double> ref_expert_mats(const RefMats& r, const float* x) {
  std::vector<float> act(size_t(r.I));
  for (int64_t i = 0; i < r.I; ++i) {
    double g = 0.0, u = 0.0;
    for (int64_t j = 0; j < r.D; ++j) {
      g += double(r.w1[size_t(i * r.D + j)]) * double(x[j]);
      u += double(r.w3[size_t(i * r.D + j)]) * double(x[j]);
    }
    const float gc = std::min(float(g), kSwigluLimit), uc = std::clamp(float(u), -kSwigluLimit, kSwigluLimit);
    act[size_t(i)] = gc / (1.0f + std::exp(-gc)) * uc;
  }
  std::vector<double> y(size_t(r.D));
  for (int64_t d = 0; d < r.D; ++d) {
    double s = 0.0;
    for (int64_t i = 0; i < r.I; ++i) s += double(r.w2[size_t(d * r.I + i)]) * double(act[size_t(i)]);
    y[size_t(d)] = s;
  }
  return y;
}

struct FastCase {
  std::string name;
  GgmlType up, down;  // routed gate/up and down types (unused when k == 0)
  bool shared;        // FP8 shared expert
  int k;
  int64_t D, I;
  int E;
  std::vector<int64_t> Ts;
  std::vector<bool> exact;  // MMA precisions to run (true: kBf16x3)
};

class MoeDecodeFastTest : public ::testing::TestWithParam<FastCase> {};

TEST_P(MoeDecodeFastTest, MatchesReferenceAndRepeatsBits) {
  AFF_SKIP_WITHOUT_GPU();
  const FastCase c = GetParam();
  AFF_SEEDED_RNG(seed, rng);
  testing::Keep keep;
  const int64_t D = c.D, I = c.I;
  std::vector<dsv4::ExpertWeights> routed(size_t(c.k > 0 ? c.E : 1)), shared(1);
  for (auto& e : routed) {
    e.w1 = testing::random_ggml_linear(c.up, I, D, rng, keep);
    e.w3 = testing::random_ggml_linear(c.up, I, D, rng, keep);
    e.w2 = testing::random_ggml_linear(c.down, D, I, rng, keep);
  }
  shared[0].w1 = testing::random_native_linear(WeightFormat::kFP8Block, I, D, rng, keep);
  shared[0].w3 = testing::random_native_linear(WeightFormat::kFP8Block, I, D, rng, keep);
  shared[0].w2 = testing::random_native_linear(WeightFormat::kFP8Block, D, I, rng, keep);
  Uploaded ur, us;
  upload_experts(routed, ur);
  upload_experts(shared, us);
  std::vector<RefMats> rr;
  if (c.k > 0)
    for (const auto& e : routed) rr.push_back(dequant(e));
  const RefMats rs = c.shared ? dequant(shared[0]) : RefMats{};
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, c.E - 1);
  std::uniform_real_distribution<float> wd(0.1f, 1.5f);
  for (int64_t T : c.Ts) {
    std::vector<float> x(size_t(T * D));
    for (float& v : x) v = nd(rng);
    std::vector<int32_t> ids(size_t(T * std::max(c.k, 1)));
    std::vector<float> rw(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = pick(rng), rw[i] = wd(rng);  // repeats allowed
    std::vector<float> want(size_t(T * D), 0.0f);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> acc(size_t(D), 0.0);
      std::vector<std::vector<double>> ys(size_t(c.E));  // each expert once per token (ids repeat)
      for (int j = 0; j < c.k; ++j) {
        const int e = ids[size_t(t * c.k + j)];
        if (ys[size_t(e)].empty()) ys[size_t(e)] = ref_expert_mats(rr[size_t(e)], x.data() + t * D);
        const std::vector<double>& y = ys[size_t(e)];
        for (int64_t d = 0; d < D; ++d) acc[size_t(d)] += double(rw[size_t(t * c.k + j)]) * y[size_t(d)];
      }
      if (c.shared) {
        const std::vector<double> y = ref_expert_mats(rs, x.data() + t * D);
        for (int64_t d = 0; d < D; ++d) acc[size_t(d)] += y[size_t(d)];
      }
      for (int64_t d = 0; d < D; ++d) want[size_t(t * D + d)] = float(acc[size_t(d)]);
    }
    auto dx = upload_vector(x, "x");
    auto dids = upload_vector(ids, "ids");
    auto drw = upload_vector(rw, "route_w");
    auto dout = upload_vector(std::vector<float>(want.size(), std::nanf("")), "out");
    ASSERT_TRUE(dx.is_ok() && dids.is_ok() && drw.is_ok() && dout.is_ok());
    MoeDecodeArgs a;
    a.slots = ur.table.as<ExpertSlot>(), a.ids = dids->as<int32_t>(), a.route_w = drw->as<float>(), a.k = c.k;
    a.routed_format = DevFormat::kGgml, a.shared_format = DevFormat::kFP8Block;
    a.routed_ggml_up = ur.host[0].w1.ggml_type, a.routed_ggml_down = ur.host[0].w2.ggml_type;
    a.shared_fp8_block = us.host[0].w1.block;
    a.shared_slot = c.shared ? us.table.as<ExpertSlot>() : nullptr;
    a.x = dx->as<float>(), a.T = T, a.D = D, a.inter = I, a.swiglu_limit = kSwigluLimit, a.out = dout->as<float>();
    auto act = DeviceBuffer::allocate(size_t(moe_decode_act_bytes(a)), "act");
    // Each routed pair's w2 as the up launch hands it to the down launch (zeroed: a pair the
    // up launch missed would fault).
    auto pair_w2 = DeviceBuffer::allocate(ids.size() * sizeof(void*), "pair_w2");
    ASSERT_TRUE(act.is_ok() && pair_w2.is_ok());
    ASSERT_EQ(cudaMemset(pair_w2->data(), 0, pair_w2->bytes()), cudaSuccess);
    a.act = act->as<float>();
    // The streaming kernels serve every T of these cases (T <= kMoeFastMaxTokens).
    ASSERT_TRUE(moe_fast_supported(a)) << "the streaming kernels must take this layout (T=" << T << ")";
    for (bool exact : c.exact) {
      set_mma_precision(exact ? MmaPrecision::kBf16x3 : MmaPrecision::kBf16);
      std::vector<float> runs[2];
      for (int r = 0; r < 2; ++r) {  // the second run with the w2 handoff (the decode step's form)
        MoeDecodeArgs ar = a;
        if (r == 1) ar.pair_w2 = pair_w2->as<const uint8_t*>();
        ASSERT_TRUE(moe_decode_up(ar, nullptr).is_ok());
        ASSERT_TRUE(moe_decode_down(ar, nullptr).is_ok());
        auto got = download_vector(dout->as<float>(), want.size(), "out");
        ASSERT_TRUE(got.is_ok());
        runs[r] = std::move(got).value();
      }
      set_mma_precision(MmaPrecision::kBf16x3);
      for (float v : runs[0]) ASSERT_TRUE(std::isfinite(v)) << "T=" << T;
      EXPECT_EQ(std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * 4), 0) << "T=" << T << ": not repeatable (or the w2 handoff differs)";
      const double e = rel_rms(runs[0].data(), want.data(), want.size());
      std::printf("[moe-fast] %s %s T=%lld: rel_rms %.3e\n", c.name.c_str(), exact ? "exact" : "fast", (long long)T, e);
      const double bound = c.k > 0 ? kGgmlMaxRelRms : exact ? kNativeMaxRelRms : kFastNativeMaxRelRms;
      EXPECT_LE(e, bound) << "T=" << T << (exact ? " exact" : " fast");
      if (c.k > 0 && c.shared) {
        // The decode step's split form: the shared expert alone over half the
        // SMs into its own output, then the routed pairs adding it.
        set_mma_precision(exact ? MmaPrecision::kBf16x3 : MmaPrecision::kBf16);
        MoeDecodeArgs sh = a, ro = a;
        auto sh_out = DeviceBuffer::allocate(want.size() * 4, "shared out");
        ASSERT_TRUE(sh_out.is_ok());
        sh.k = 0, sh.act = a.act + T * c.k * I, sh.out = sh_out->as<float>();
        sh.max_sms = std::max(1, current_device_multiprocessors() / 2);
        ro.shared_slot = nullptr, ro.add = sh.out, ro.pair_w2 = pair_w2->as<const uint8_t*>();
        ASSERT_TRUE(moe_decode_streams(sh) && moe_decode_streams(ro)) << "T=" << T;
        ASSERT_TRUE(copy_to_device(dout->data(), std::vector<float>(want.size(), std::nanf("")).data(),
                                   want.size() * 4, "out").is_ok());
        ASSERT_TRUE(moe_decode_up(sh, nullptr).is_ok());
        ASSERT_TRUE(moe_decode_down(sh, nullptr).is_ok());
        ASSERT_TRUE(moe_decode_up(ro, nullptr).is_ok());
        ASSERT_TRUE(moe_decode_down(ro, nullptr).is_ok());
        set_mma_precision(MmaPrecision::kBf16x3);
        auto got = download_vector(dout->as<float>(), want.size(), "out");
        ASSERT_TRUE(got.is_ok());
        const double es = rel_rms(got->data(), want.data(), want.size());
        const double vs_fused = rel_rms(got->data(), runs[0].data(), want.size());
        std::printf("[moe-fast] %s %s T=%lld split: rel_rms %.3e, vs one launch pair %.3e\n", c.name.c_str(),
                    exact ? "exact" : "fast", (long long)T, es, vs_fused);
        EXPECT_LE(es, bound) << "T=" << T << " split";
        // Same products, only the final sum's order differs.
        EXPECT_LE(vs_fused, 1e-5) << "T=" << T << " split vs one launch pair";
        // The general kernels refuse what only the streaming ones implement.
        MoeDecodeArgs bad = ro;
        bad.routed_format = DevFormat::kMXFP4;
        EXPECT_FALSE(moe_decode_down(bad, nullptr).is_ok());
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, MoeDecodeFastTest,
    ::testing::Values(
        // The V4 geometry and recipe: Q2_K gate/up, Q3_K down, FP8 shared, 6 of a few experts.
        FastCase{"V4_Q2K_Q3K_FP8", GgmlType::kQ2_K, GgmlType::kQ3_K, true, 6, 4096, 2048, 2, {1, 8}, {true, false}},
        FastCase{"IQ2XXS_Q2K_FP8", GgmlType::kIQ2_XXS, GgmlType::kQ2_K, true, 6, 1024, 512, 4, {1, 2, 8}, {true, false}},
        FastCase{"IQ2XXS_Q3K_FP8_wide", GgmlType::kIQ2_XXS, GgmlType::kQ3_K, true, 3, 2048, 1024, 3, {1, 5}, {true}},
        // 768 columns: 6 lanes of 8 per row do work (idle lanes, odd super-blocks).
        FastCase{"Q3K_Q2K_no_shared", GgmlType::kQ3_K, GgmlType::kQ2_K, false, 4, 768, 768, 5, {1, 3, 8}, {true}},
        FastCase{"Q2K_Q2K_FP8_small", GgmlType::kQ2_K, GgmlType::kQ2_K, true, 2, 512, 256, 3, {1, 8}, {true}},
        FastCase{"FP8_shared_only", GgmlType::kQ2_K, GgmlType::kQ2_K, true, 0, 1024, 512, 1, {1, 3, 8}, {true, false}}),
    [](const ::testing::TestParamInfo<FastCase>& i) { return i.param.name; });

// Timing of the streaming kernels at the V4 geometry (not a correctness test:
// random bytes, run with --gtest_also_run_disabled_tests). 64 distinct experts,
// ids cycling over them so every launch reads its weights from HBM; reports each
// launch alone and the split between routed and shared work.
TEST(MoeDecodeFastBench, DISABLED_Timing) {
  AFF_SKIP_WITHOUT_GPU();
  const int64_t D = 4096, I = 2048;
  const int E = 64, k = 6, sets = 16;
  struct Recipe {
    const char* name;
    GgmlType up, down;
    int bb_up, bb_down;  // block bytes per 256 elements
  };
  const Recipe recipes[] = {{"Q2_K+Q3_K", GgmlType::kQ2_K, GgmlType::kQ3_K, 84, 110},
                            {"IQ2_XXS+Q2_K", GgmlType::kIQ2_XXS, GgmlType::kQ2_K, 66, 84}};
  auto tables = ggml_device_tables();
  ASSERT_TRUE(tables.is_ok());
  std::mt19937_64 rng(5);
  auto random_buffer = [&](size_t bytes) {
    std::vector<uint8_t> h(bytes);
    for (size_t i = 0; i + 8 <= bytes; i += 8) {
      const uint64_t v = rng();
      std::memcpy(h.data() + i, &v, 8);
    }
    auto b = upload_vector(h, "bench");
    EXPECT_TRUE(b.is_ok());
    return std::move(b).value();
  };
  std::vector<DeviceBuffer> keep_buf;
  // FP8 shared expert with E8M0 scales.
  auto fp8 = [&](int64_t out, int64_t in) {
    DeviceLinear w;
    w.format = DevFormat::kFP8Block, w.scale_type = DevScale::kE8M0, w.block = 128;
    w.out = out, w.in = in, w.scale_cols = in / 128;
    keep_buf.push_back(random_buffer(size_t(out * in)));
    w.weight = keep_buf.back().as<uint8_t>();
    std::vector<uint8_t> sc(size_t(out / 128 * in / 128), uint8_t(120));
    auto d = upload_vector(sc, "scales");
    EXPECT_TRUE(d.is_ok());
    keep_buf.push_back(std::move(d).value());
    w.scale = keep_buf.back().as<uint8_t>();
    return w;
  };
  ExpertSlot shared{fp8(I, D), fp8(I, D), fp8(D, I)};
  auto dshared = upload_vector(std::vector<ExpertSlot>{shared}, "shared");
  ASSERT_TRUE(dshared.is_ok());
  std::vector<float> xh(size_t(8 * D));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& v : xh) v = nd(rng);
  auto dx = upload_vector(xh, "x");
  auto dout = DeviceBuffer::allocate(size_t(8 * D) * 4, "out");
  auto drw = upload_vector(std::vector<float>(size_t(8 * k), 0.2f), "rw");
  std::vector<int32_t> ids(size_t(sets * 8 * k));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 37 + i / 6) % E);
  auto dids = upload_vector(ids, "ids");
  ASSERT_TRUE(dx.is_ok() && dout.is_ok() && drw.is_ok() && dids.is_ok());
  for (const Recipe& r : recipes) {
    auto ggml = [&](GgmlType t, int bb, int64_t out, int64_t in) {
      DeviceLinear w;
      w.format = DevFormat::kGgml, w.ggml_type = int32_t(t), w.out = out, w.in = in;
      w.row_bytes = in / 256 * bb, w.tables = reinterpret_cast<const uint8_t*>(*tables);
      keep_buf.push_back(random_buffer(size_t(out * w.row_bytes)));
      w.weight = keep_buf.back().as<uint8_t>();
      return w;
    };
    std::vector<ExpertSlot> slots;
    for (int e = 0; e < E; ++e) slots.push_back({ggml(r.up, r.bb_up, I, D), ggml(r.up, r.bb_up, I, D), ggml(r.down, r.bb_down, D, I)});
    auto dslots = upload_vector(slots, "slots");
    ASSERT_TRUE(dslots.is_ok());
    const double up_routed = 2.0 * double(I * (D / 256) * r.bb_up), down_routed = double(D * (I / 256) * r.bb_down);
    const double up_shared = 2.0 * double(I * D), down_shared = double(D * I);
    for (int64_t T : {int64_t(1), int64_t(2), kMoeFastMaxTokens}) {
      for (int mode = 0; mode < 3; ++mode) {  // 0: routed + shared, 1: routed only, 2: shared only
        MoeDecodeArgs a;
        a.slots = dslots->as<ExpertSlot>(), a.route_w = drw->as<float>(), a.k = mode == 2 ? 0 : k;
        a.routed_format = DevFormat::kGgml, a.shared_format = DevFormat::kFP8Block;
        a.routed_ggml_up = int(r.up), a.routed_ggml_down = int(r.down);
        a.shared_slot = mode == 1 ? nullptr : dshared->as<ExpertSlot>();
        a.x = dx->as<float>(), a.T = T, a.D = D, a.inter = I, a.swiglu_limit = 10.0f, a.out = dout->as<float>();
        auto act = DeviceBuffer::allocate(size_t(moe_decode_act_bytes(a)), "act");
        ASSERT_TRUE(act.is_ok());
        a.act = act->as<float>();
        ASSERT_TRUE(moe_fast_supported(a));
        for (bool exact : {true, false}) {
          if (!exact && mode == 1) continue;  // the routed kernels do not depend on the precision
          set_mma_precision(exact ? MmaPrecision::kBf16x3 : MmaPrecision::kBf16);
          cudaEvent_t e0, e1, e2;
          cudaEventCreate(&e0), cudaEventCreate(&e1), cudaEventCreate(&e2);
          float up_ms = 0.0f, down_ms = 0.0f;
          const int reps = 3;
          for (int rep = 0; rep < reps; ++rep) {
            for (int i = 0; i < sets; ++i) {
              a.ids = dids->as<int32_t>() + size_t(i) * 8 * k;
              cudaEventRecord(e0);
              ASSERT_TRUE(moe_decode_up(a, nullptr).is_ok());
              cudaEventRecord(e1);
              ASSERT_TRUE(moe_decode_down(a, nullptr).is_ok());
              cudaEventRecord(e2);
              cudaEventSynchronize(e2);
              float u = 0.0f, d = 0.0f;
              cudaEventElapsedTime(&u, e0, e1), cudaEventElapsedTime(&d, e1, e2);
              if (rep > 0) up_ms += u, down_ms += d;
            }
          }
          cudaEventDestroy(e0), cudaEventDestroy(e1), cudaEventDestroy(e2);
          const double n = double((reps - 1) * sets);
          const double pairs = double(mode == 2 ? 0 : T * k);
          const double ub = pairs * up_routed + (mode == 1 ? 0.0 : up_shared);
          const double db = pairs * down_routed + (mode == 1 ? 0.0 : down_shared);
          const double us_up = 1e3 * up_ms / n, us_down = 1e3 * down_ms / n;
          std::printf("[moe-bench] %-13s T=%lld %-13s %-5s up %7.1f us %5.2f TB/s | down %7.1f us %5.2f TB/s\n", r.name,
                      (long long)T, mode == 0 ? "routed+shared" : mode == 1 ? "routed" : "shared",
                      exact ? "exact" : "fast", us_up, ub / us_up * 1e-6, us_down, db / us_down * 1e-6);
        }
        set_mma_precision(MmaPrecision::kBf16x3);
      }
    }
  }
}

}  // namespace
}  // namespace aff::cuda
