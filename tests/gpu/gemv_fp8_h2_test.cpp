// The fast-setting FP8 decode GEMV (f16 packed FMAs, x scaled to unit range)
// against the exact f32 GEMV on the same device weights: odd row counts,
// V4-Flash widths, a row range, x with a large dynamic range, and the
// grouped form the attention's output projection uses.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cuda/kernels/gemm/mma_precision.h"
#include "backend/cuda/kernels/gemv/gemv.h"
#include "backend/cuda/runtime/device_buffer.h"
#include "device_random_linear.h"
#include "gpu_test_util.h"

namespace aff::cuda {
namespace {

// f16 rounding of x (11-bit mantissa) and of 8-product partial sums: ~1e-3
// relative per dot at worst, far less in RMS over a row of outputs.
constexpr double kMaxRelRms = 2e-3;

double rel_rms(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

std::vector<float> down(const DeviceBuffer& b, size_t n) {
  std::vector<float> v(n);
  EXPECT_TRUE(copy_to_host(v.data(), b.data(), n * 4, "test").is_ok());
  return v;
}

struct Shape {
  int64_t out, in, row_begin, row_end;
};

class GemvFp8H2 : public ::testing::TestWithParam<Shape> {};

TEST_P(GemvFp8H2, MatchesTheExactGemv) {
  AFF_SKIP_WITHOUT_GPU();
  const Shape sh = GetParam();
  std::mt19937_64 rng(std::random_device{}());
  testing::RandomWeight rw = testing::make_weight(DevFormat::kFP8Block, sh.out, sh.in, rng);
  ASSERT_TRUE(gemv_fp8_h2_supports(rw.w));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(size_t(sh.in));
  for (size_t i = 0; i < x.size(); ++i) x[i] = nd(rng) * (i % 97 == 0 ? 300.0f : 1.0f);  // outliers
  auto dx = upload_vector(x, "x");
  ASSERT_TRUE(dx.is_ok());
  const int64_t n = sh.row_end - sh.row_begin;
  auto want_b = DeviceBuffer::allocate(size_t(n) * 4, "y");
  auto got_b = DeviceBuffer::allocate(size_t(n) * 4, "y");
  ASSERT_TRUE(want_b.is_ok() && got_b.is_ok());
  set_mma_precision(MmaPrecision::kBf16x3);  // the exact path
  ASSERT_TRUE(gemv_rows_f32(rw.w, sh.row_begin, sh.row_end, dx->as<float>(), sh.in, 1, want_b->as<float>(), n, nullptr)
                  .is_ok());
  ASSERT_TRUE(gemv_fp8_h2(rw.w, sh.row_begin, sh.row_end, dx->as<float>(), sh.out, 0, got_b->as<float>(), nullptr)
                  .is_ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const double e = rel_rms(down(*got_b, size_t(n)), down(*want_b, size_t(n)));
  std::printf("[fp8-h2] %lldx%lld rows [%lld,%lld): rel_rms %.3e\n", (long long)sh.out, (long long)sh.in,
              (long long)sh.row_begin, (long long)sh.row_end, e);
  EXPECT_LE(e, kMaxRelRms);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemvFp8H2,
                         ::testing::Values(Shape{1024, 4096, 0, 1024}, Shape{512, 4096, 0, 512},
                                           Shape{4096, 8192, 0, 4096}, Shape{32768, 1024, 0, 32768},
                                           Shape{333, 1536, 0, 333}, Shape{2048, 4096, 700, 1901}));

TEST(GemvFp8H2Grouped, EachGroupReadsItsOwnSlice) {
  AFF_SKIP_WITHOUT_GPU();
  const int64_t G = 8, R = 96, in = 1024;
  std::mt19937_64 rng(7);
  testing::RandomWeight rw = testing::make_weight(DevFormat::kFP8Block, G * R, in, rng);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(size_t(G * in));
  for (float& v : x) v = nd(rng);
  auto dx = upload_vector(x, "x");
  ASSERT_TRUE(dx.is_ok());
  auto want_b = DeviceBuffer::allocate(size_t(G * R) * 4, "y");
  auto got_b = DeviceBuffer::allocate(size_t(G * R) * 4, "y");
  ASSERT_TRUE(want_b.is_ok() && got_b.is_ok());
  set_mma_precision(MmaPrecision::kBf16x3);
  for (int64_t g = 0; g < G; ++g)
    ASSERT_TRUE(gemv_rows_f32(rw.w, g * R, (g + 1) * R, dx->as<float>() + g * in, in, 1,
                              want_b->as<float>() + g * R, R, nullptr)
                    .is_ok());
  ASSERT_TRUE(gemv_fp8_h2(rw.w, 0, G * R, dx->as<float>(), R, in, got_b->as<float>(), nullptr).is_ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const double e = rel_rms(down(*got_b, size_t(G * R)), down(*want_b, size_t(G * R)));
  std::printf("[fp8-h2] grouped %lldx(%lldx%lld): rel_rms %.3e\n", (long long)G, (long long)R, (long long)in, e);
  EXPECT_LE(e, kMaxRelRms);
}

}  // namespace
}  // namespace aff::cuda
