// The prefill GEMM (kernels/gemm, cuBLAS on bf16-decoded weight tiles) against
// the GEMV, which tests/gpu/kernels_test.cpp holds to the CPU reference at f32
// rounding: every format it decodes, odd row ranges and strides, and the
// linear() dispatch on both sides of the crossover.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "backend/cuda/check/op_check.h"
#include "backend/cuda/kernels/gemm/gemm.h"
#include "backend/cuda/kernels/gemv/gemv.h"
#include "backend/cuda/linear.h"
#include "backend/cuda/runtime/device_buffer.h"
#include "core/dtype.h"
#include "device_random_linear.h"
#include "gpu_test_util.h"

namespace aff::cuda {
namespace {

using testing::make_weight;
using testing::name_of;
using testing::RandomWeight;

// W decodes to bf16 exactly (FP8, MXFP4, BF16); x as hi + lo bf16 keeps ~16
// bits: a few 1e-6.
constexpr double kTolBf16x3 = 2e-5;
// x rounded once to bf16 (2^-9 relative per element), averaged over `in`
// products: relative RMS ~1.5e-3 on random data.
constexpr double kTolBf16 = 1e-2;

TEST(PrefillGemm, MatchesGemvForEveryFormat) {
  AFF_SKIP_WITHOUT_GPU();
  AFF_SEEDED_RNG(seed, rng);
  struct Shape {
    int64_t out, in, T, row_begin, row_end, ldx_pad, ldy_pad;
  };
  for (DevFormat f : {DevFormat::kF32, DevFormat::kBF16, DevFormat::kF16, DevFormat::kFP8Block, DevFormat::kMXFP4}) {
    for (const Shape& s : {Shape{300, 416, 67, 0, 300, 0, 0}, Shape{1031, 256, 129, 130, 1031, 32, 7},
                           Shape{96, 4096, 70, 0, 96, 0, 0}}) {
      if (f == DevFormat::kFP8Block && s.in % 16) continue;
      RandomWeight rw = make_weight(f, s.out, s.in, rng);
      const int64_t ldx = s.in + s.ldx_pad, rows = s.row_end - s.row_begin, ldy = rows + s.ldy_pad;
      std::normal_distribution<float> nd(0.0f, 1.0f);
      std::vector<float> x(size_t(s.T * ldx));
      for (float& v : x) v = nd(rng);
      auto dx = upload_vector(x, "x");
      auto want = DeviceBuffer::allocate(size_t(s.T * ldy) * 4, "want");
      auto got = DeviceBuffer::allocate(size_t(s.T * ldy) * 4, "got");
      ASSERT_TRUE(dx.is_ok() && want.is_ok() && got.is_ok());
      ASSERT_TRUE(cudaMemset(want->data(), 0, want->bytes()) == cudaSuccess);
      ASSERT_TRUE(cudaMemset(got->data(), 0, got->bytes()) == cudaSuccess);
      ASSERT_TRUE(gemv_rows_f32(rw.w, s.row_begin, s.row_end, dx->as<float>(), ldx, s.T, want->as<float>(), ldy,
                                nullptr).is_ok());
      auto w_host = download_vector(want->as<float>(), size_t(s.T * ldy), "want");
      ASSERT_TRUE(w_host.is_ok());
      for (MmaPrecision p : {MmaPrecision::kBf16x3, MmaPrecision::kBf16}) {
        if (!gemm_supports(rw.w, p)) {  // F32/F16 weights do not decode to bf16 exactly
          EXPECT_FALSE(gemm_rows_bf16(rw.w, s.row_begin, s.row_end, dx->as<float>(), ldx, s.T, got->as<float>(), ldy, p, nullptr)
                           .is_ok());
          continue;
        }
        ASSERT_TRUE(gemm_rows_bf16(rw.w, s.row_begin, s.row_end, dx->as<float>(), ldx, s.T, got->as<float>(), ldy, p,
                                   nullptr).is_ok());
        auto g_host = download_vector(got->as<float>(), size_t(s.T * ldy), "got");
        ASSERT_TRUE(g_host.is_ok());
        const double err = rel_rms(g_host->data(), w_host->data(), g_host->size());
        const double tol = p == MmaPrecision::kBf16x3 ? kTolBf16x3 : kTolBf16;
        std::printf("[gemm] %-5s %5lld x %5lld rows [%lld, %lld) T %3lld %-6s rel rms %.2e (tol %.0e)\n", name_of(f),
                    (long long)s.out, (long long)s.in, (long long)s.row_begin, (long long)s.row_end, (long long)s.T,
                    p == MmaPrecision::kBf16x3 ? "bf16x3" : "bf16", err, tol);
        EXPECT_LE(err, tol) << name_of(f);
      }
    }
  }
}

TEST(PrefillGemm, LinearDispatchesByTokenCount) {
  AFF_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(7);
  RandomWeight rw = make_weight(DevFormat::kFP8Block, 256, 384, rng);
  EXPECT_FALSE(linear_uses_gemm(rw.w, 1));
  EXPECT_FALSE(linear_uses_gemm(rw.w, kGemmMinTokens - 1));
  EXPECT_TRUE(linear_uses_gemm(rw.w, kGemmMinTokens));
  DeviceLinear ggml = rw.w;
  ggml.format = DevFormat::kGgml;
  EXPECT_FALSE(linear_uses_gemm(ggml, 4096)) << "formats without a bf16 decoder stay on the GEMV";
  for (int64_t T : {int64_t(1), kGemmMinTokens + 3}) {
    std::vector<float> x(size_t(T * 384), 0.5f);
    auto dx = upload_vector(x, "x");
    auto a = DeviceBuffer::allocate(size_t(T * 256) * 4, "a"), b = DeviceBuffer::allocate(size_t(T * 256) * 4, "b");
    ASSERT_TRUE(dx.is_ok() && a.is_ok() && b.is_ok());
    ASSERT_TRUE(linear(rw.w, dx->as<float>(), T, a->as<float>(), nullptr).is_ok());
    ASSERT_TRUE(gemv_f32(rw.w, dx->as<float>(), T, b->as<float>(), nullptr).is_ok());
    auto ha = download_vector(a->as<float>(), size_t(T * 256), "a");
    auto hb = download_vector(b->as<float>(), size_t(T * 256), "b");
    ASSERT_TRUE(ha.is_ok() && hb.is_ok());
    EXPECT_LE(rel_rms(ha->data(), hb->data(), ha->size()), kTolBf16x3) << "T " << T;
  }
}

// x: [T, cols] of N(0, 1) on the device.
DeviceBuffer random_rows(int64_t T, int64_t cols, std::mt19937_64& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(size_t(T * cols));
  for (float& v : x) v = nd(rng);
  auto d = upload_vector(x, "x");
  EXPECT_TRUE(d.is_ok());
  return d.is_ok() ? std::move(*d) : DeviceBuffer();
}

std::vector<float> host_of(const DeviceBuffer& b) {
  auto h = download_vector(b.as<float>(), b.bytes() / 4, "y");
  EXPECT_TRUE(h.is_ok());
  return h.is_ok() ? std::move(*h) : std::vector<float>();
}

// wo_a's shape in small: G groups of R rows, group g reading x's columns
// [g*K, (g+1)*K); the batched GEMM against each group's GEMV.
TEST(PrefillGemm, GroupedRowsMatchPerGroupGemv) {
  AFF_SKIP_WITHOUT_GPU();
  AFF_SEEDED_RNG(seed, rng);
  const int G = 3;
  const int64_t R = 96, K = 256, T = kGemmMinTokens + 5, ldx = G * K + 8, ldy = G * R + 3;
  for (DevFormat f : {DevFormat::kFP8Block, DevFormat::kMXFP4}) {
    RandomWeight rw = make_weight(f, G * R, K, rng);
    DeviceBuffer x = random_rows(T, ldx, rng);
    auto want = DeviceBuffer::allocate(size_t(T * ldy) * 4, "want");
    auto got = DeviceBuffer::allocate(size_t(T * ldy) * 4, "got");
    ASSERT_TRUE(want.is_ok() && got.is_ok());
    ASSERT_EQ(cudaMemset(want->data(), 0, want->bytes()), cudaSuccess);
    ASSERT_EQ(cudaMemset(got->data(), 0, got->bytes()), cudaSuccess);
    for (int g = 0; g < G; ++g)
      ASSERT_TRUE(gemv_rows_f32(rw.w, g * R, (g + 1) * R, x.as<float>() + g * K, ldx, T, want->as<float>() + g * R,
                                ldy, nullptr).is_ok());
    for (MmaPrecision p : {MmaPrecision::kBf16x3, MmaPrecision::kBf16}) {
      ASSERT_TRUE(gemm_grouped_rows_bf16(rw.w, G, R, x.as<float>(), ldx, T, got->as<float>(), ldy, p, nullptr).is_ok());
      const std::vector<float> w_host = host_of(*want), g_host = host_of(*got);
      const double err = rel_rms(g_host.data(), w_host.data(), g_host.size());
      const double tol = p == MmaPrecision::kBf16x3 ? kTolBf16x3 : kTolBf16;
      std::printf("[gemm] grouped %-5s %d x %lld x %lld T %lld %-6s rel rms %.2e (tol %.0e)\n", name_of(f), G,
                  (long long)R, (long long)K, (long long)T, p == MmaPrecision::kBf16x3 ? "bf16x3" : "bf16", err, tol);
      EXPECT_LE(err, tol) << name_of(f);
    }
  }
}

// Under a GemmSharedInput the GEMMs on its x share one split, a GEMM on other
// activations in between keeps its own, and once it ends x's new contents are
// split afresh (no stale split).
TEST(PrefillGemm, SharedInputSplitsOnceAndNeverGoesStale) {
  AFF_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(11);
  const int64_t T = kGemmMinTokens + 9, K = 320;
  RandomWeight a = make_weight(DevFormat::kFP8Block, 128, K, rng);
  RandomWeight b = make_weight(DevFormat::kFP8Block, 200, K, rng);
  DeviceBuffer x = random_rows(T, K, rng), other = random_rows(T, K, rng);
  auto ya = DeviceBuffer::allocate(size_t(T * 128) * 4, "ya"), yb = DeviceBuffer::allocate(size_t(T * 200) * 4, "yb");
  auto yo = DeviceBuffer::allocate(size_t(T * 128) * 4, "yo"), ref = DeviceBuffer::allocate(size_t(T * 200) * 4, "ref");
  ASSERT_TRUE(ya.is_ok() && yb.is_ok() && yo.is_ok() && ref.is_ok());
  const MmaPrecision p = MmaPrecision::kBf16x3;
  auto check = [&](const DeviceBuffer& got, const RandomWeight& w, const DeviceBuffer& in, const char* what) {
    ASSERT_TRUE(gemv_rows_f32(w.w, 0, w.w.out, in.as<float>(), K, T, ref->as<float>(), w.w.out, nullptr).is_ok());
    std::vector<float> g = host_of(got), r = host_of(*ref);
    r.resize(g.size());
    EXPECT_LE(rel_rms(g.data(), r.data(), g.size()), kTolBf16x3) << what;
  };
  {
    GemmSharedInput shared(x.as<float>(), K, T, K, nullptr);
    ASSERT_TRUE(gemm_rows_bf16(a.w, 0, 128, x.as<float>(), K, T, ya->as<float>(), 128, p, nullptr).is_ok());
    ASSERT_TRUE(gemm_rows_bf16(a.w, 0, 128, other.as<float>(), K, T, yo->as<float>(), 128, p, nullptr).is_ok());
    ASSERT_TRUE(gemm_rows_bf16(b.w, 0, 200, x.as<float>(), K, T, yb->as<float>(), 200, p, nullptr).is_ok());
  }
  check(*ya, a, x, "first GEMM on the shared input");
  check(*yo, a, other, "GEMM on other activations inside the scope");
  check(*yb, b, x, "second GEMM on the shared input");
  // Same buffer, new contents, after the scope: the split must be made again.
  ASSERT_EQ(cudaMemcpy(x.data(), other.data(), x.bytes(), cudaMemcpyDeviceToDevice), cudaSuccess);
  ASSERT_TRUE(gemm_rows_bf16(b.w, 0, 200, x.as<float>(), K, T, yb->as<float>(), 200, p, nullptr).is_ok());
  check(*yb, b, other, "GEMM on rewritten x after the scope");
}

}  // namespace
}  // namespace aff::cuda
