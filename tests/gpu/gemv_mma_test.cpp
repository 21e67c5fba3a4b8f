// The tensor-core GEMV (gemv_mma.cu) against a double-precision host product
// of the same weights: FP8 (E4M3 codes, E8M0 scales) and BF16; V4-Flash widths, a tail
// tile (rows not a multiple of 16), a row range, 1..8 tokens (and more, which
// takes several launches), x with outliers, an all-zero block and tiny values,
// subnormal E4M3 codes, and the grouped form the attention's output projection
// uses, the side stream's strided plain launch. Both precision settings.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/kernels/gemm/mma_precision.h"
#include "backend/cuda/kernels/gemv/gemv.h"
#include "backend/cuda/runtime/device_buffer.h"
#include "core/dtype.h"
#include "gpu_test_util.h"

namespace aff::cuda {
namespace {

// Exact setting: x carried as two f16 (FP8 weights, ~2^-22) or three bf16
// (BF16 weights, ~2^-24) and f32 accumulation, so the error is f32 rounding of
// the sums (~1e-7 relative in RMS).
constexpr double kExactRelRms = 2e-6;
// Fast setting: x rounded to f16 once per element (FP8: 2^-12 relative at
// worst, ~2^-13 in RMS over a dot product) or to bf16 hi + mid (BF16: ~2^-16).
constexpr double kFastRelRms = 1e-3;

struct HostFp8 {
  int64_t out, in, scale_cols;
  std::vector<uint8_t> w, s;  // [out, in] E4M3; [ceil(out/128), in/128] E8M0
  double at(int64_t r, int64_t k) const {
    return double(e4m3_to_f32(w[size_t(r * in + k)])) *
           std::ldexp(1.0, int(s[size_t((r / 128) * scale_cols + k / 128)]) - 127);
  }
};

HostFp8 random_fp8(int64_t out, int64_t in, std::mt19937_64& rng) {
  HostFp8 h{out, in, in / 128, {}, {}};
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> e8(120, 132), sub(1, 7);
  h.w.resize(size_t(out * in));
  for (size_t i = 0; i < h.w.size(); ++i)
    h.w[i] = i % 211 == 5 ? uint8_t(sub(rng) | (i & 1 ? 0x80 : 0)) : f32_to_e4m3(nd(rng) * 40.0f);  // some subnormals
  h.s.resize(size_t((out + 127) / 128 * h.scale_cols));
  for (uint8_t& v : h.s) v = uint8_t(e8(rng));
  return h;
}

// h's weight on the device: codes in dw, scales in ds.
DeviceLinear fp8_linear(const HostFp8& h, const DeviceBuffer& dw, const DeviceBuffer& ds) {
  DeviceLinear w;
  w.format = DevFormat::kFP8Block, w.scale_type = DevScale::kE8M0, w.block = 128;
  w.out = h.out, w.in = h.in, w.scale_cols = h.scale_cols;
  w.weight = dw.as<uint8_t>(), w.scale = ds.as<uint8_t>();
  return w;
}

// Two FP8 weights on the device for a pair launch, with NaN-filled outputs
// y1 [T, h1.out] and y2 [T, h2.out]: a row the launch misses stays NaN and
// fails the check.
struct DeviceFp8Pair {
  DeviceBuffer w1, s1, w2, s2, y1, y2;
  DeviceLinear l1, l2;
};

Result<DeviceFp8Pair> upload_pair(const HostFp8& h1, const HostFp8& h2, int64_t T) {
  DeviceFp8Pair d;
  AFF_ASSIGN_OR_RETURN(d.w1, upload_vector(h1.w, "w1"));
  AFF_ASSIGN_OR_RETURN(d.s1, upload_vector(h1.s, "s1"));
  AFF_ASSIGN_OR_RETURN(d.w2, upload_vector(h2.w, "w2"));
  AFF_ASSIGN_OR_RETURN(d.s2, upload_vector(h2.s, "s2"));
  AFF_ASSIGN_OR_RETURN(d.y1, upload_vector(std::vector<float>(size_t(T * h1.out), std::nanf("")), "y1"));
  AFF_ASSIGN_OR_RETURN(d.y2, upload_vector(std::vector<float>(size_t(T * h2.out), std::nanf("")), "y2"));
  d.l1 = fp8_linear(h1, d.w1, d.s1), d.l2 = fp8_linear(h2, d.w2, d.s2);
  return d;
}

std::vector<float> random_x(int64_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (size_t i = 0; i < x.size(); ++i) x[i] = nd(rng) * (i % 97 == 0 ? 300.0f : 1.0f);
  for (size_t i = 128; i < 256 && i < x.size(); ++i) x[i] = 0.0f;       // an all-zero block
  for (size_t i = 256; i < 384 && i < x.size(); ++i) x[i] *= 1e-30f;    // a tiny one
  return x;
}

// h's product with T rows of x ([T, h.in], float or double) in double: [T, h.out].
template <typename X>
std::vector<double> host_product(const HostFp8& h, const std::vector<X>& x, int64_t T) {
  std::vector<double> want(size_t(T * h.out));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t r = 0; r < h.out; ++r) {
      double s = 0.0;
      for (int64_t k = 0; k < h.in; ++k) s += h.at(r, k) * double(x[size_t(t * h.in + k)]);
      want[size_t(t * h.out + r)] = s;
    }
  return want;
}

// x's rows [T, in] rmsnorm'd with weight norm [in] in double, in the kernels'
// order: norm * (x * 1 / rms).
std::vector<double> host_normed(const std::vector<float>& x, const std::vector<float>& norm, int64_t T, int64_t in,
                                float eps) {
  std::vector<double> xn(size_t(T * in));
  for (int64_t t = 0; t < T; ++t) {
    double ss = 0.0;
    for (int64_t k = 0; k < in; ++k) ss += double(x[size_t(t * in + k)]) * x[size_t(t * in + k)];
    const double inv = 1.0 / std::sqrt(ss / double(in) + eps);
    for (int64_t k = 0; k < in; ++k) xn[size_t(t * in + k)] = norm[size_t(k)] * (x[size_t(t * in + k)] * inv);
  }
  return xn;
}

double rel_rms(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

struct Shape {
  int64_t out, in, row_begin, row_end, T;
};

// Downloads y ([T, rows] of sh, token t at y + t*ldy; ldy 0: rows), checks
// that the gaps between rows still hold `gap`, that the rows are finite and
// within the setting's bound of want, and prints the error.
void expect_close(const DeviceBuffer& y, const std::vector<double>& want, const Shape& sh, bool exact,
                  const char* kind, int64_t ldy = 0, float gap = 0.0f) {
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  set_mma_precision(MmaPrecision::kBf16x3);
  const int64_t n = sh.row_end - sh.row_begin;
  if (ldy == 0) ldy = n;
  ASSERT_GE(ldy, n);
  std::vector<float> all(size_t(sh.T * ldy));
  ASSERT_TRUE(copy_to_host(all.data(), y.data(), all.size() * 4, "y").is_ok());
  std::vector<float> got(size_t(sh.T * n));
  for (int64_t t = 0; t < sh.T; ++t) {
    for (int64_t r = 0; r < n; ++r) got[size_t(t * n + r)] = all[size_t(t * ldy + r)];
    for (int64_t r = n; r < ldy; ++r) ASSERT_EQ(all[size_t(t * ldy + r)], gap) << "token " << t << " column " << r;
  }
  ASSERT_EQ(got.size(), want.size());
  for (float v : got) ASSERT_TRUE(std::isfinite(v));
  const double e = rel_rms(got, want);
  std::printf("[gemv-mma %s] %s %lldx%lld rows [%lld,%lld) T=%lld ldy %lld: rel_rms %.3e\n", kind,
              exact ? "exact" : "fast", (long long)sh.out, (long long)sh.in, (long long)sh.row_begin,
              (long long)sh.row_end, (long long)sh.T, (long long)ldy, e);
  EXPECT_LE(e, exact ? kExactRelRms : kFastRelRms);
}

class GemvFp8Mma : public ::testing::TestWithParam<std::tuple<Shape, bool>> {};

TEST_P(GemvFp8Mma, MatchesTheHostProduct) {
  AFF_SKIP_WITHOUT_GPU();
  const auto [sh, exact] = GetParam();
  AFF_SEEDED_RNG(seed, rng);
  const HostFp8 h = random_fp8(sh.out, sh.in, rng);
  const std::vector<float> x = random_x(sh.T * sh.in, rng);
  const int64_t n = sh.row_end - sh.row_begin;
  std::vector<double> want(size_t(sh.T * n));
  for (int64_t t = 0; t < sh.T; ++t)
    for (int64_t r = 0; r < n; ++r) {
      double s = 0.0;
      for (int64_t k = 0; k < sh.in; ++k) s += h.at(sh.row_begin + r, k) * x[size_t(t * sh.in + k)];
      want[size_t(t * n + r)] = s;
    }

  auto dw = upload_vector(h.w, "w");
  auto ds = upload_vector(h.s, "s");
  auto dx = upload_vector(x, "x");
  auto dy = DeviceBuffer::allocate(size_t(sh.T * n) * 4, "y");
  ASSERT_TRUE(dw.is_ok() && ds.is_ok() && dx.is_ok() && dy.is_ok());
  const DeviceLinear w = fp8_linear(h, *dw, *ds);
  ASSERT_TRUE(gemv_mma_supports(w, sh.row_begin, (sh.out + 15) / 16 * 16));
  set_mma_precision(exact ? MmaPrecision::kBf16x3 : MmaPrecision::kBf16);
  // Through the public GEMV entry, which must route FP8 here.
  ASSERT_TRUE(gemv_rows_f32(w, sh.row_begin, sh.row_end, dx->as<float>(), sh.in, sh.T, dy->as<float>(), n, nullptr)
                  .is_ok());
  expect_close(*dy, want, sh, exact, "fp8");
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GemvFp8Mma,
    ::testing::Combine(::testing::Values(Shape{1024, 4096, 0, 1024, 1}, Shape{512, 4096, 0, 512, 3},
                                         Shape{4096, 8192, 0, 4096, 1}, Shape{2048, 1024, 0, 2048, 8},
                                         Shape{333, 1536, 0, 333, 2}, Shape{2048, 4096, 704, 1901, 5},
                                         Shape{256, 8192, 0, 256, 11}),
                       ::testing::Bool()));

class GemvBf16Mma : public ::testing::TestWithParam<std::tuple<Shape, bool>> {};

TEST_P(GemvBf16Mma, MatchesTheHostProduct) {
  AFF_SKIP_WITHOUT_GPU();
  const auto [sh, exact] = GetParam();
  AFF_SEEDED_RNG(seed, rng);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> wb(size_t(sh.out * sh.in));
  for (uint16_t& v : wb) v = f32_to_bf16(nd(rng) * 0.05f);
  const std::vector<float> x = random_x(sh.T * sh.in, rng);
  const int64_t n = sh.row_end - sh.row_begin;
  std::vector<double> want(size_t(sh.T * n));
  for (int64_t t = 0; t < sh.T; ++t)
    for (int64_t r = 0; r < n; ++r) {
      double s = 0.0;
      for (int64_t k = 0; k < sh.in; ++k)
        s += double(bf16_to_f32(wb[size_t((sh.row_begin + r) * sh.in + k)])) * x[size_t(t * sh.in + k)];
      want[size_t(t * n + r)] = s;
    }
  auto dw = upload_vector(wb, "w");
  auto dx = upload_vector(x, "x");
  auto dy = DeviceBuffer::allocate(size_t(sh.T * n) * 4, "y");
  ASSERT_TRUE(dw.is_ok() && dx.is_ok() && dy.is_ok());
  DeviceLinear w;
  w.format = DevFormat::kBF16, w.out = sh.out, w.in = sh.in, w.weight = dw->as<uint8_t>();
  ASSERT_TRUE(gemv_mma_supports(w, sh.row_begin, (sh.out + 15) / 16 * 16));
  set_mma_precision(exact ? MmaPrecision::kBf16x3 : MmaPrecision::kBf16);
  // Called directly: gemv_rows_f32 routes BF16 here only with AFF_CUDA_BF16_MMA=1.
  const int64_t whole = (sh.out + 15) / 16 * 16;
  ASSERT_TRUE(gemv_mma(w, sh.row_begin, sh.row_end, dx->as<float>(), sh.in, sh.T, dy->as<float>(), n, whole, 0,
                       nullptr)
                  .is_ok());
  expect_close(*dy, want, sh, exact, "bf16");
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GemvBf16Mma,
    ::testing::Combine(::testing::Values(Shape{1024, 4096, 0, 1024, 1}, Shape{64, 4096, 0, 64, 2},
                                         Shape{333, 1536, 0, 333, 8}, Shape{2048, 4096, 704, 1901, 3},
                                         Shape{256, 8192, 0, 256, 11}),
                       ::testing::Bool()));

TEST(GemvFp8MmaGrouped, EachGroupReadsItsOwnSlice) {
  AFF_SKIP_WITHOUT_GPU();
  const int64_t G = 8, R = 96, in = 1024, T = 2;
  std::mt19937_64 rng(7);
  const HostFp8 h = random_fp8(G * R, in, rng);
  const std::vector<float> x = random_x(T * G * in, rng);  // token t, group g at x + t*G*in + g*in
  std::vector<double> want(size_t(T * G * R));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t r = 0; r < G * R; ++r) {
      double s = 0.0;
      for (int64_t k = 0; k < in; ++k) s += h.at(r, k) * x[size_t(t * G * in + (r / R) * in + k)];
      want[size_t(t * G * R + r)] = s;
    }
  auto dw = upload_vector(h.w, "w");
  auto ds = upload_vector(h.s, "s");
  auto dx = upload_vector(x, "x");
  auto dy = DeviceBuffer::allocate(size_t(T * G * R) * 4, "y");
  ASSERT_TRUE(dw.is_ok() && ds.is_ok() && dx.is_ok() && dy.is_ok());
  const DeviceLinear w = fp8_linear(h, *dw, *ds);
  set_mma_precision(MmaPrecision::kBf16x3);
  ASSERT_TRUE(gemv_mma(w, 0, G * R, dx->as<float>(), G * in, T, dy->as<float>(), G * R, R, in, nullptr).is_ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> got(size_t(T * G * R));
  ASSERT_TRUE(copy_to_host(got.data(), dy->data(), got.size() * 4, "y").is_ok());
  const double e = rel_rms(got, want);
  std::printf("[gemv-mma fp8] grouped %lldx(%lldx%lld) T=%lld: rel_rms %.3e\n", (long long)G, (long long)R,
              (long long)in, (long long)T, e);
  EXPECT_LE(e, kExactRelRms);
}

// Two weights stacked in one launch (the attention's wq_a and wkv share x):
// each output must equal its own product, including a second weight whose row
// count is not a multiple of 16, for 1..8 tokens and both precisions.
class GemvFp8MmaPair : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, int64_t, int64_t, bool>> {};

TEST_P(GemvFp8MmaPair, EachWeightWritesItsOwnProduct) {
  AFF_SKIP_WITHOUT_GPU();
  const auto [out1, out2, in, T, exact] = GetParam();
  AFF_SEEDED_RNG(seed, rng);
  const HostFp8 h1 = random_fp8(out1, in, rng), h2 = random_fp8(out2, in, rng);
  const std::vector<float> x = random_x(T * in, rng);
  const std::vector<double> want1 = host_product(h1, x, T), want2 = host_product(h2, x, T);
  auto d = upload_pair(h1, h2, T);
  auto dx = upload_vector(x, "x");
  ASSERT_TRUE(d.is_ok() && dx.is_ok());
  ASSERT_TRUE(gemv_mma_pair_supports(d->l1, d->l2));
  set_mma_precision(exact ? MmaPrecision::kBf16x3 : MmaPrecision::kBf16);
  ASSERT_TRUE(gemv_mma_pair(d->l1, d->l2, dx->as<float>(), in, T, d->y1.as<float>(), out1, d->y2.as<float>(), out2,
                            nullptr)
                  .is_ok());
  expect_close(d->y1, want1, Shape{out1, in, 0, out1, T}, exact, "fp8 pair w1");
  expect_close(d->y2, want2, Shape{out2, in, 0, out2, T}, exact, "fp8 pair w2");
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemvFp8MmaPair,
                         ::testing::Values(std::make_tuple(int64_t(1024), int64_t(512), int64_t(4096), int64_t(1), true),
                                           std::make_tuple(int64_t(1024), int64_t(512), int64_t(4096), int64_t(1), false),
                                           std::make_tuple(int64_t(256), int64_t(333), int64_t(1536), int64_t(3), true),
                                           std::make_tuple(int64_t(128), int64_t(640), int64_t(1024), int64_t(8), true),
                                           std::make_tuple(int64_t(1024), int64_t(512), int64_t(4096), int64_t(11), false)));

// BF16 weights stacked in one launch: a compressor's wkv and wgate at decode
// (V4's CSA 2 x 1024 rows, the indexer's 2 x 256, an odd second weight) for
// 1..4 tokens and both precisions; the last field caps the launch's blocks
// (PairOptions::max_blocks: wider blocks, fewer split-K warps; 0: uncapped).
class GemvBf16MmaPair
    : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, int64_t, int64_t, bool, int>> {};

TEST_P(GemvBf16MmaPair, EachWeightWritesItsOwnProduct) {
  AFF_SKIP_WITHOUT_GPU();
  const auto [out1, out2, in, T, exact, max_blocks] = GetParam();
  AFF_SEEDED_RNG(seed, rng);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto random_rows = [&](int64_t out) {
    std::vector<uint16_t> w(size_t(out * in));
    for (uint16_t& v : w) v = f32_to_bf16(nd(rng) * 0.05f);
    return w;
  };
  const std::vector<uint16_t> h1 = random_rows(out1), h2 = random_rows(out2);
  const std::vector<float> x = random_x(T * in, rng);
  auto product = [&](const std::vector<uint16_t>& h, int64_t out) {
    std::vector<double> want(size_t(T * out));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t r = 0; r < out; ++r) {
        double s = 0.0;
        for (int64_t k = 0; k < in; ++k) s += double(bf16_to_f32(h[size_t(r * in + k)])) * x[size_t(t * in + k)];
        want[size_t(t * out + r)] = s;
      }
    return want;
  };
  const std::vector<double> want1 = product(h1, out1), want2 = product(h2, out2);
  auto dw1 = upload_vector(h1, "w1");
  auto dw2 = upload_vector(h2, "w2");
  auto dx = upload_vector(x, "x");
  auto dy1 = upload_vector(std::vector<float>(size_t(T * out1), std::nanf("")), "y1");
  auto dy2 = upload_vector(std::vector<float>(size_t(T * out2), std::nanf("")), "y2");
  ASSERT_TRUE(dw1.is_ok() && dw2.is_ok() && dx.is_ok() && dy1.is_ok() && dy2.is_ok());
  DeviceLinear w1, w2;
  w1.format = w2.format = DevFormat::kBF16;
  w1.in = w2.in = in, w1.out = out1, w2.out = out2;
  w1.weight = dw1->as<uint8_t>(), w2.weight = dw2->as<uint8_t>();
  ASSERT_TRUE(gemv_mma_pair_supports(w1, w2));
  set_mma_precision(exact ? MmaPrecision::kBf16x3 : MmaPrecision::kBf16);
  PairOptions o;
  o.max_blocks = max_blocks;
  ASSERT_TRUE(
      gemv_mma_pair(w1, w2, dx->as<float>(), in, T, dy1->as<float>(), out1, dy2->as<float>(), out2, nullptr, o)
          .is_ok());
  expect_close(*dy1, want1, Shape{out1, in, 0, out1, T}, exact, "bf16 pair w1");
  expect_close(*dy2, want2, Shape{out2, in, 0, out2, T}, exact, "bf16 pair w2");
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemvBf16MmaPair,
                         ::testing::Values(std::make_tuple(int64_t(1024), int64_t(1024), int64_t(4096), int64_t(1), true, 0),
                                           std::make_tuple(int64_t(1024), int64_t(1024), int64_t(4096), int64_t(1), false, 0),
                                           std::make_tuple(int64_t(256), int64_t(256), int64_t(4096), int64_t(2), true, 0),
                                           std::make_tuple(int64_t(128), int64_t(333), int64_t(1536), int64_t(3), true, 0),
                                           std::make_tuple(int64_t(1024), int64_t(1024), int64_t(4096), int64_t(4), true, 32),
                                           std::make_tuple(int64_t(1024), int64_t(1024), int64_t(4096), int64_t(4), false, 16),
                                           std::make_tuple(int64_t(256), int64_t(256), int64_t(4096), int64_t(4), true, 7),
                                           std::make_tuple(int64_t(128), int64_t(333), int64_t(1536), int64_t(3), true, 5)));

// The side stream's plain projection (the shared expert's down after its
// streaming up): x and y strided (token t at x + t*ldx, y + t*ldy, the gaps
// not part of the product), the grid capped or not, 1..5 tokens, both
// precisions. The gaps of y hold a sentinel the launch must leave alone.
class GemvFp8MmaSide : public ::testing::TestWithParam<std::tuple<Shape, int64_t, int64_t, int, bool>> {};

TEST_P(GemvFp8MmaSide, StridedRowsMatchTheHostProduct) {
  AFF_SKIP_WITHOUT_GPU();
  const auto [sh, ldx, ldy, max_blocks, exact] = GetParam();
  ASSERT_GE(ldx, sh.in);
  ASSERT_GE(ldy, sh.out);
  AFF_SEEDED_RNG(seed, rng);
  const HostFp8 h = random_fp8(sh.out, sh.in, rng);
  const std::vector<float> xs = random_x(sh.T * ldx, rng);  // [T, ldx]; columns >= in are ignored
  std::vector<float> x(size_t(sh.T * sh.in));                // the packed rows the product reads
  for (int64_t t = 0; t < sh.T; ++t)
    for (int64_t k = 0; k < sh.in; ++k) x[size_t(t * sh.in + k)] = xs[size_t(t * ldx + k)];
  const std::vector<double> packed = host_product(h, x, sh.T);
  const float sentinel = -12345.0f;
  auto dw = upload_vector(h.w, "w");
  auto ds = upload_vector(h.s, "s");
  auto dx = upload_vector(xs, "x");
  auto dy = upload_vector(std::vector<float>(size_t(sh.T * ldy), sentinel), "y");
  ASSERT_TRUE(dw.is_ok() && ds.is_ok() && dx.is_ok() && dy.is_ok());
  const DeviceLinear w = fp8_linear(h, *dw, *ds);
  set_mma_precision(exact ? MmaPrecision::kBf16x3 : MmaPrecision::kBf16);
  ASSERT_TRUE(gemv_mma_side(w, dx->as<float>(), ldx, sh.T, dy->as<float>(), ldy, max_blocks, nullptr).is_ok());
  const std::string kind = "side ldx " + std::to_string(ldx) + " max_blocks " + std::to_string(max_blocks);
  expect_close(*dy, packed, sh, exact, kind.c_str(), ldy, sentinel);
}

// V4-Flash's shared down (4096 x 2048, x the f32 SwiGLU rows of the up
// launch), an odd row count with a row stride not a multiple of 4 (the
// kernel's scalar x loads), capped grids.
INSTANTIATE_TEST_SUITE_P(
    Shapes, GemvFp8MmaSide,
    ::testing::Values(std::make_tuple(Shape{4096, 2048, 0, 4096, 1}, int64_t(2048), int64_t(4096), 66, true),
                      std::make_tuple(Shape{4096, 2048, 0, 4096, 1}, int64_t(2048), int64_t(4096), 66, false),
                      std::make_tuple(Shape{4096, 2048, 0, 4096, 3}, int64_t(2176), int64_t(4160), 0, true),
                      std::make_tuple(Shape{333, 1536, 0, 333, 5}, int64_t(1539), int64_t(401), 7, true),
                      std::make_tuple(Shape{1024, 1024, 0, 1024, 2}, int64_t(1280), int64_t(1056), 1, false)));

// The query path's q_norm folded into wq_b: x's rows RMS-normalised with a
// weight inside the launch must match the double product of the normalised
// rows, for 1..8 tokens (and more: several launches) and both precisions.
class GemvFp8MmaNormed : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, int64_t, bool>> {};

TEST_P(GemvFp8MmaNormed, MatchesTheProductOfTheNormalisedRows) {
  AFF_SKIP_WITHOUT_GPU();
  const auto [out, in, T, exact] = GetParam();
  AFF_SEEDED_RNG(seed, rng);
  const HostFp8 h = random_fp8(out, in, rng);
  const std::vector<float> x = random_x(T * in, rng);
  std::vector<float> norm(static_cast<size_t>(in));
  std::uniform_real_distribution<float> ud(0.5f, 1.5f);
  for (float& v : norm) v = ud(rng);
  const float eps = 1e-6f;
  const std::vector<double> want = host_product(h, host_normed(x, norm, T, in, eps), T);
  auto dw = upload_vector(h.w, "w");
  auto ds = upload_vector(h.s, "s");
  auto dx = upload_vector(x, "x");
  auto dn = upload_vector(norm, "norm");
  auto dy = upload_vector(std::vector<float>(size_t(T * out), std::nanf("")), "y");
  ASSERT_TRUE(dw.is_ok() && ds.is_ok() && dx.is_ok() && dn.is_ok() && dy.is_ok());
  const DeviceLinear w = fp8_linear(h, *dw, *ds);
  set_mma_precision(exact ? MmaPrecision::kBf16x3 : MmaPrecision::kBf16);
  ASSERT_TRUE(gemv_mma_normed(w, dx->as<float>(), T, dy->as<float>(), dn->as<float>(), eps, nullptr).is_ok());
  expect_close(*dy, want, Shape{out, in, 0, out, T}, exact, "fp8 normed");
  // The x the kernel normalised in place is untouched.
  auto back = download_vector(dx->as<float>(), x.size(), "x");
  ASSERT_TRUE(back.is_ok());
  EXPECT_EQ(*back, x);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemvFp8MmaNormed,
                         ::testing::Values(std::make_tuple(int64_t(4096), int64_t(1024), int64_t(1), true),
                                           std::make_tuple(int64_t(4096), int64_t(1024), int64_t(1), false),
                                           std::make_tuple(int64_t(333), int64_t(1536), int64_t(5), true),
                                           std::make_tuple(int64_t(256), int64_t(1024), int64_t(11), true)));

// The pair with x rmsnorm'd in the launch (the query path's wq_b stacked over
// the indexer's wq_b, both reading q_norm(qr)): each output must equal the
// host's product of the normalised x, at 1 and 2 tokens, both precisions.
class GemvFp8MmaPairNormed : public ::testing::TestWithParam<std::tuple<int64_t, bool>> {};

TEST_P(GemvFp8MmaPairNormed, BothWeightsReadTheNormedX) {
  AFF_SKIP_WITHOUT_GPU();
  const auto [T, exact] = GetParam();
  const int64_t out1 = 2048, out2 = 512, in = 1024;
  const float eps = 1e-6f;
  AFF_SEEDED_RNG(seed, rng);
  const HostFp8 h1 = random_fp8(out1, in, rng), h2 = random_fp8(out2, in, rng);
  const std::vector<float> x = random_x(T * in, rng);
  std::normal_distribution<float> nd(1.0f, 0.3f);
  std::vector<float> norm(static_cast<size_t>(in));
  for (float& v : norm) v = nd(rng);
  const std::vector<double> xn = host_normed(x, norm, T, in, eps);
  const std::vector<double> want1 = host_product(h1, xn, T), want2 = host_product(h2, xn, T);
  auto d = upload_pair(h1, h2, T);
  auto dx = upload_vector(x, "x");
  auto dn = upload_vector(norm, "norm");
  ASSERT_TRUE(d.is_ok() && dx.is_ok() && dn.is_ok());
  ASSERT_TRUE(gemv_mma_pair_supports(d->l1, d->l2));
  set_mma_precision(exact ? MmaPrecision::kBf16x3 : MmaPrecision::kBf16);
  PairOptions o;
  o.norm = dn->as<float>(), o.eps = eps;
  ASSERT_TRUE(gemv_mma_pair(d->l1, d->l2, dx->as<float>(), in, T, d->y1.as<float>(), out1, d->y2.as<float>(), out2,
                            nullptr, o)
                  .is_ok());
  expect_close(d->y1, want1, Shape{out1, in, 0, out1, T}, exact, "fp8 normed pair w1");
  expect_close(d->y2, want2, Shape{out2, in, 0, out2, T}, exact, "fp8 normed pair w2");
}

INSTANTIATE_TEST_SUITE_P(Tokens, GemvFp8MmaPairNormed,
                         ::testing::Combine(::testing::Values(int64_t(1), int64_t(2)), ::testing::Bool()));

}  // namespace
}  // namespace aff::cuda
