// Single kernels against the CPU reference on odd shapes with fresh random
// data: the GEMV for every weight format (vector and scalar paths, partial
// FP8 blocks, 1..17 tokens), and the indexer's top-k (ties, fewer entries than
// k, many entries).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cuda/check/op_check.h"
#include "backend/cuda/kernels/gemv/gemv.h"
#include "backend/cuda/kernels/indexer/indexer.h"
#include "backend/cuda/runtime/device_buffer.h"
#include "backend/cuda/runtime/device_info.h"
#include "backend/cuda/runtime/device_model.h"
#include "backend/ref/linear.h"
#include "core/dtype.h"
#include "gpu_test_util.h"

namespace aff::cuda {
namespace {


// A random weight [out, in] stored as `format`, bytes owned by `keep`.
dsv4::Linear random_linear(dsv4::WeightFormat format, int64_t out, int64_t in, int block, std::mt19937_64& rng,
                           std::vector<std::shared_ptr<std::vector<uint8_t>>>& keep) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> sd(120, 130);
  auto buffer = [&](size_t n) {
    keep.push_back(std::make_shared<std::vector<uint8_t>>(n));
    return keep.back()->data();
  };
  dsv4::Linear w;
  w.format = format, w.out = out, w.in = in, w.block = block;
  w.weight.name = "test.weight", w.weight.file = "<random>";
  w.weight.shape = {out, in};
  switch (format) {
    case dsv4::WeightFormat::kF32: {
      float* p = reinterpret_cast<float*>(buffer(size_t(out * in) * 4));
      for (int64_t i = 0; i < out * in; ++i) p[i] = nd(rng);
      w.weight.dtype = DType::kF32, w.weight.data = reinterpret_cast<uint8_t*>(p), w.weight.nbytes = out * in * 4;
      break;
    }
    case dsv4::WeightFormat::kBF16:
    case dsv4::WeightFormat::kF16: {
      uint16_t* p = reinterpret_cast<uint16_t*>(buffer(size_t(out * in) * 2));
      const bool bf = format == dsv4::WeightFormat::kBF16;
      for (int64_t i = 0; i < out * in; ++i) p[i] = bf ? f32_to_bf16(nd(rng)) : f32_to_f16(nd(rng));
      w.weight.dtype = bf ? DType::kBF16 : DType::kF16;
      w.weight.data = reinterpret_cast<uint8_t*>(p), w.weight.nbytes = out * in * 2;
      break;
    }
    case dsv4::WeightFormat::kFP8Block: {
      uint8_t* p = buffer(size_t(out * in));
      for (int64_t i = 0; i < out * in; ++i) p[i] = f32_to_e4m3(nd(rng) * 100.0f);
      const int64_t so = (out + block - 1) / block, si = (in + block - 1) / block;
      uint8_t* s = buffer(size_t(so * si));
      for (int64_t i = 0; i < so * si; ++i) s[i] = uint8_t(sd(rng));
      w.weight.dtype = DType::kF8E4M3, w.weight.data = p, w.weight.nbytes = out * in;
      w.scale.name = "test.scale", w.scale.dtype = DType::kF8E8M0, w.scale.shape = {so, si};
      w.scale.data = s, w.scale.nbytes = so * si;
      break;
    }
    case dsv4::WeightFormat::kMXFP4: {
      uint8_t* p = buffer(size_t(out * in / 2));
      std::uniform_int_distribution<int> byte(0, 255);
      for (int64_t i = 0; i < out * in / 2; ++i) p[i] = uint8_t(byte(rng));
      uint8_t* s = buffer(size_t(out * in / 32));
      for (int64_t i = 0; i < out * in / 32; ++i) s[i] = uint8_t(sd(rng));
      w.weight.dtype = DType::kI8, w.weight.data = p, w.weight.nbytes = out * in / 2;
      w.scale.name = "test.scale", w.scale.dtype = DType::kF8E8M0, w.scale.shape = {out, in / 32};
      w.scale.data = s, w.scale.nbytes = out * in / 32;
      break;
    }
    case dsv4::WeightFormat::kGgml: break;
  }
  return w;
}

struct GemvCase {
  dsv4::WeightFormat format;
  int64_t out, in;
  int block;
};

class GemvTest : public ::testing::TestWithParam<GemvCase> {};

TEST_P(GemvTest, MatchesReferenceForOddShapes) {
  AFF_SKIP_WITHOUT_GPU();
  const GemvCase c = GetParam();
  AFF_SEEDED_RNG(seed, rng);
  std::vector<std::shared_ptr<std::vector<uint8_t>>> keep;
  const dsv4::Linear w = random_linear(c.format, c.out, c.in, c.block, rng, keep);
  DeviceArena arena;
  ASSERT_TRUE(arena.reserve(linear_device_bytes(w), "test").is_ok());
  auto dw = upload_linear(w, arena);
  ASSERT_TRUE(dw.is_ok()) << dw.status().message();
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t T : {1, 4, 5, 17}) {
    std::vector<float> x(size_t(T * c.in)), want(size_t(T * c.out));
    for (float& v : x) v = nd(rng);
    ref::linear(w, x.data(), T, want.data());
    auto dx = upload_vector(x, "x");
    ASSERT_TRUE(dx.is_ok());
    std::vector<float> poison(want.size(), std::nanf(""));
    auto dy = upload_vector(poison, "y");
    ASSERT_TRUE(dy.is_ok());
    ASSERT_TRUE(gemv_f32(*dw, dx->as<float>(), T, dy->as<float>(), nullptr).is_ok());
    auto got = download_vector(dy->as<float>(), want.size(), "y");
    ASSERT_TRUE(got.is_ok());
    EXPECT_LE(rel_rms(got->data(), want.data(), want.size()), 1e-5) << "T=" << T;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Formats, GemvTest,
    ::testing::Values(GemvCase{dsv4::WeightFormat::kF32, 97, 128, 0}, GemvCase{dsv4::WeightFormat::kF32, 17, 97, 0},
                      GemvCase{dsv4::WeightFormat::kBF16, 97, 1024, 0},
                      GemvCase{dsv4::WeightFormat::kBF16, 33, 97, 0}, GemvCase{dsv4::WeightFormat::kF16, 41, 200, 0},
                      GemvCase{dsv4::WeightFormat::kFP8Block, 257, 384, 128},
                      GemvCase{dsv4::WeightFormat::kFP8Block, 97, 200, 128},   // partial column block
                      GemvCase{dsv4::WeightFormat::kFP8Block, 45, 97, 32},     // scalar path
                      GemvCase{dsv4::WeightFormat::kMXFP4, 97, 2048, 0}, GemvCase{dsv4::WeightFormat::kMXFP4, 1, 32, 0},
                      GemvCase{dsv4::WeightFormat::kMXFP4, 129, 96, 0}));

// Brute-force top-k: highest score first, ties to the lower id; returned sorted by id.
std::vector<int32_t> topk_reference(const float* s, int64_t n, int k) {
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  if (n > k) {
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return s[a] > s[b] || (s[a] == s[b] && a < b); });
    order.resize(size_t(k));
  }
  std::sort(order.begin(), order.end());
  return order;
}

TEST(IndexerTopk, MatchesBruteForceWithTiesAndShortRows) {
  AFF_SKIP_WITHOUT_GPU();
  AFF_SEEDED_RNG(seed, rng);
  for (const auto& [n_entries, k, ratio] : {std::tuple<int64_t, int, int>{1000, 37, 4}, {3001, 512, 4}, {20, 64, 4}}) {
    const int64_t T = 9, pos0 = n_entries * ratio - T;  // the last queries see every entry
    std::vector<float> scores(size_t(T * n_entries));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_int_distribution<int> coarse(-3, 3);
    for (size_t i = 0; i < scores.size(); ++i)  // half the rows heavily tied
      scores[i] = (i / size_t(n_entries)) % 2 ? float(coarse(rng)) : nd(rng);
    auto ds = upload_vector(scores, "scores");
    ASSERT_TRUE(ds.is_ok());
    auto sel = DeviceBuffer::allocate(size_t(T * k) * 4, "sel");
    auto cnt = DeviceBuffer::allocate(size_t(T) * 4, "count");
    auto step = upload_vector(std::vector<StepInfo>{StepInfo{pos0, T}}, "step");
    ASSERT_TRUE(sel.is_ok() && cnt.is_ok() && step.is_ok());
    TopkArgs a;
    a.step = step->as<StepInfo>(), a.scores = ds->as<float>(), a.ld = n_entries, a.T = T;
    a.ratio = ratio, a.k = k, a.sel = sel->as<int32_t>(), a.count = cnt->as<int32_t>();
    ASSERT_TRUE(indexer_topk(a, nullptr).is_ok());
    auto got_sel = download_vector(sel->as<int32_t>(), size_t(T * k), "sel");
    auto got_cnt = download_vector(cnt->as<int32_t>(), size_t(T), "count");
    ASSERT_TRUE(got_sel.is_ok() && got_cnt.is_ok());
    for (int64_t t = 0; t < T; ++t) {
      const int64_t n_vis = std::min(n_entries, (pos0 + t + 1) / ratio);
      const std::vector<int32_t> want = topk_reference(scores.data() + t * n_entries, n_vis, k);
      ASSERT_EQ((*got_cnt)[size_t(t)], int32_t(want.size())) << "query " << t;
      std::vector<int32_t> got(got_sel->begin() + t * k, got_sel->begin() + t * k + int64_t(want.size()));
      std::sort(got.begin(), got.end());
      EXPECT_EQ(got, want) << "query " << t << " of n_entries " << n_entries << ", k " << k;
    }
  }
}

// The decode form (topk_grid): one block for rows under a small bound, else
// blocks of >= 1024 entries each (one up to 1024 visible, then two, ...);
// rows of at most k, heavily tied or not; each case launched twice on the
// same scratch, which must be zero again after.
TEST(IndexerTopk, DecodeFormMatchesBruteForce) {
  AFF_SKIP_WITHOUT_GPU();
  AFF_SEEDED_RNG(seed, rng);
  const int k = 512, ratio = 4;
  auto scratch = DeviceBuffer::allocate(size_t(kTopkScratchWords) * 4, "scratch");
  ASSERT_TRUE(scratch.is_ok());
  ASSERT_EQ(cudaMemset(scratch->data(), 0, scratch->bytes()), cudaSuccess);
  struct Case {
    int64_t ld, bound;
    std::vector<int64_t> n;
  };
  const std::vector<Case> cases = {
      {300007, kTopkOneBlockEntries, {300, k + 1, 1024, 1025, kTopkOneBlockEntries}},
      {5000, 0, {300, k + 1, 1024, 1025, 3 * 1024 - 17, 5000}},
      {300007, 0, {300, k + 1, 1024, 1025, 3 * 1024 - 17, 150006, 300007}},
  };
  for (const Case& c : cases) {
    const TopkGrid g = topk_grid(c.bound > 0 ? c.bound : c.ld, 1, current_device_multiprocessors());
    ASSERT_EQ(g.blocks > 1, c.bound == 0) << "ld " << c.ld << ", bound " << c.bound;
    for (const int64_t n : c.n) {
      for (const bool tied : {false, true}) {
        SCOPED_TRACE("ld " + std::to_string(c.ld) + ", bound " + std::to_string(c.bound) + ", n " + std::to_string(n) +
                     (tied ? ", tied" : ""));
        std::vector<float> scores(size_t(c.ld), 7.0f);  // past n: never read
        std::normal_distribution<float> nd(0.0f, 1.0f);
        std::uniform_int_distribution<int> coarse(-3, 3);
        for (int64_t j = 0; j < n; ++j) scores[size_t(j)] = tied ? float(coarse(rng)) : nd(rng);
        auto ds = upload_vector(scores, "scores");
        auto sel = DeviceBuffer::allocate(size_t(k) * 4, "sel");
        auto cnt = DeviceBuffer::allocate(4, "count");
        auto step = upload_vector(std::vector<StepInfo>{StepInfo{n * ratio - 1, 1}}, "step");
        ASSERT_TRUE(ds.is_ok() && sel.is_ok() && cnt.is_ok() && step.is_ok());
        TopkArgs a;
        a.step = step->as<StepInfo>(), a.scores = ds->as<float>(), a.ld = c.ld, a.T = 1;
        a.ratio = ratio, a.k = k, a.sel = sel->as<int32_t>(), a.count = cnt->as<int32_t>();
        a.scratch = scratch->as<uint32_t>(), a.bound = c.bound;
        const std::vector<int32_t> want = topk_reference(scores.data(), n, k);
        for (int rep = 0; rep < 2; ++rep) {
          ASSERT_EQ(cudaMemset(sel->data(), 0xff, sel->bytes()), cudaSuccess);
          ASSERT_TRUE(indexer_topk(a, nullptr).is_ok());
          auto got_sel = download_vector(sel->as<int32_t>(), size_t(k), "sel");
          auto got_cnt = download_vector(cnt->as<int32_t>(), 1, "count");
          auto left = download_vector(scratch->as<uint32_t>(), size_t(kTopkScratchWords), "scratch");
          ASSERT_TRUE(got_sel.is_ok() && got_cnt.is_ok() && left.is_ok());
          ASSERT_EQ((*got_cnt)[0], int32_t(want.size())) << "launch " << rep;
          // Written in id order already: no sort before the comparison.
          const std::vector<int32_t> got(got_sel->begin(), got_sel->begin() + int64_t(want.size()));
          EXPECT_EQ(got, want) << "launch " << rep;
          EXPECT_EQ(std::count(left->begin(), left->end(), 0u), kTopkScratchWords) << "scratch not reset, launch " << rep;
        }
      }
    }
  }
}

}  // namespace
}  // namespace aff::cuda
