// Dense Q8_0 weights as upload_model places them (DevFormat::kQ8: the blocks'
// codes and scales in two arrays): the split itself, the GEMV (tensor cores
// where rows allow, the f32 path otherwise) against the CPU reference in both
// precisions, an expert's gate/up pair and its down projection with the SwiGLU
// folded in, and the prefill GEMM.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/kernels/gemm/gemm.h"
#include "backend/cuda/kernels/gemm/mma_precision.h"
#include "backend/cuda/kernels/gemv/gemv.h"
#include "backend/cuda/linear.h"
#include "backend/cuda/runtime/device_buffer.h"
#include "backend/cuda/runtime/device_model.h"
#include "backend/ref/linear.h"
#include "gpu_test_util.h"
#include "host_product.h"
#include "quant/blocks.h"
#include "random_weights.h"

namespace aff::cuda {
namespace {

using quant::GgmlType;

// Errors are judged against sqrt(sum_i (w_i x_i)^2) per output (see
// host_product.h). Exact setting: x as f16 hi + lo (~2^-22), int8 codes
// exact in f16, f32 sums: a few 1e-7. Fast setting: x as f16 hi (~2^-12 per
// element). Prefill GEMM: weights rounded to bf16 (2^-9 per weight).
constexpr double kTolExact = 1e-5;
constexpr double kTolFast = 2e-3;
constexpr double kTolGemm = 1e-2;

using testing::host_product;
using testing::randn;
using testing::rel_to_size;


// A Q8_0 weight on the device as a dense weight (and its arena).
struct DenseQ8 {
  testing::Keep keep;
  dsv4::Linear host;
  DeviceArena arena;
  DeviceLinear dev;
};

void upload_q8(DenseQ8& q, int64_t out, int64_t in, std::mt19937_64& rng, const std::string& name = "blk.0.q8") {
  q.host = testing::random_ggml_linear(GgmlType::kQ8_0, out, in, rng, q.keep, name);
  ASSERT_TRUE(q.arena.reserve(linear_device_bytes(q.host), "test").is_ok());
  auto d = upload_dense_linear(q.host, q.arena);
  ASSERT_TRUE(d.is_ok()) << d.status().message();
  q.dev = *d;
}

std::vector<float> run_gemv(const DeviceLinear& w, const std::vector<float>& x, int64_t T) {
  auto dx = upload_vector(x, "x");
  auto dy = upload_vector(std::vector<float>(size_t(T * w.out), std::nanf("")), "y");
  EXPECT_TRUE(dx.is_ok() && dy.is_ok());
  if (!dx.is_ok() || !dy.is_ok()) return {};
  EXPECT_TRUE(linear(w, dx->as<float>(), T, dy->as<float>(), nullptr).is_ok());
  auto got = download_vector(dy->as<float>(), size_t(T * w.out), "y");
  EXPECT_TRUE(got.is_ok());
  return got.is_ok() ? *got : std::vector<float>();
}

TEST(DenseQ8, UploadSplitsEveryBlockIntoCodesAndScale) {
  AFF_SKIP_WITHOUT_GPU();
  AFF_SEEDED_RNG(seed, rng);
  DenseQ8 q;
  upload_q8(q, 7, 192, rng);
  ASSERT_EQ(q.dev.format, DevFormat::kQ8);
  ASSERT_EQ(q.dev.scale_type, DevScale::kF16);
  ASSERT_EQ(q.dev.scale_cols, 6);
  auto codes = download_vector(reinterpret_cast<const int8_t*>(q.dev.weight), 7 * 192, "codes");
  auto scales = download_vector(reinterpret_cast<const uint16_t*>(q.dev.scale), 7 * 6, "scales");
  ASSERT_TRUE(codes.is_ok() && scales.is_ok());
  const auto* blocks = reinterpret_cast<const quant::BlockQ8_0*>(q.host.weight.data);
  for (int b = 0; b < 7 * 6; ++b) {
    EXPECT_EQ((*scales)[size_t(b)], blocks[b].d) << "block " << b;
    const int64_t row = b / 6, col0 = (b % 6) * 32;
    for (int i = 0; i < 32; ++i)
      ASSERT_EQ((*codes)[size_t(row * 192 + q8_code_at(col0 + i))], blocks[b].qs[i]) << "block " << b << " code " << i;
  }
  // Rows of an odd number of 32-column blocks, and routed experts, keep their blocks as stored.
  DenseQ8 odd;
  upload_q8(odd, 3, 96, rng);
  EXPECT_EQ(odd.dev.format, DevFormat::kGgml);
  DeviceArena arena;
  ASSERT_TRUE(arena.reserve(linear_device_bytes(q.host), "test").is_ok());
  auto stored = upload_linear(q.host, arena);
  ASSERT_TRUE(stored.is_ok());
  EXPECT_EQ(stored->format, DevFormat::kGgml);
}

struct Shape {
  int64_t out, in;
};

class DenseQ8Gemv : public ::testing::TestWithParam<Shape> {};

// Shapes: rows % 128 == 0 take the tensor-core GEMV (V4's projections are
// 4096 / 1024 / 8192 wide), others (192) the f32 path; row counts off the 16-row tile.
TEST_P(DenseQ8Gemv, MatchesReferenceInBothPrecisions) {
  AFF_SKIP_WITHOUT_GPU();
  AFF_SEEDED_RNG(seed, rng);
  const Shape s = GetParam();
  DenseQ8 q;
  upload_q8(q, s.out, s.in, rng);
  EXPECT_EQ(gemv_mma_takes_all(q.dev), s.in % 128 == 0);
  for (bool exact : {true, false}) {
    set_mma_precision(exact ? MmaPrecision::kBf16x3 : MmaPrecision::kBf16);
    for (int64_t T : {1, 2, 3, 5, 8}) {
      const std::vector<float> x = randn(size_t(T * s.in), rng);
      std::vector<double> size;
      const std::vector<float> want = host_product(q.host, x, T, size);
      const std::vector<float> got = run_gemv(q.dev, x, T);
      ASSERT_EQ(got.size(), want.size());
      for (float v : got) ASSERT_TRUE(std::isfinite(v)) << "T=" << T;
      const double err = rel_to_size(got, want, size), tol = exact || s.in % 128 ? kTolExact : kTolFast;
      std::printf("[q8] %5lld x %5lld T %lld %-5s rel %.2e (tol %.0e)\n", (long long)s.out, (long long)s.in,
                  (long long)T, exact ? "exact" : "fast", err, tol);
      EXPECT_LE(err, tol) << "T=" << T << (exact ? " exact" : " fast") << " seed " << seed;
    }
  }
  set_mma_precision(MmaPrecision::kBf16x3);
}

INSTANTIATE_TEST_SUITE_P(Shapes, DenseQ8Gemv,
                         ::testing::Values(Shape{37, 192}, Shape{129, 4096}, Shape{1000, 1024}, Shape{48, 384},
                                           Shape{17, 8192}),
                         [](const ::testing::TestParamInfo<Shape>& i) {
                           return std::to_string(i.param.out) + "x" + std::to_string(i.param.in);
                         });

// The shared expert's decode form: gate and up in one launch, then the down
// projection reading swiglu_clamp(gate, up) (the SwiGLU computed in f64 here).
TEST(DenseQ8, ExpertPairAndSwigluDownMatchReference) {
  AFF_SKIP_WITHOUT_GPU();
  AFF_SEEDED_RNG(seed, rng);
  const int64_t D = 384, I = 256;
  const float limit = 3.0f;
  DenseQ8 w1, w3, w2;
  upload_q8(w1, I, D, rng, "shexp.w1");
  upload_q8(w3, I, D, rng, "shexp.w3");
  upload_q8(w2, D, I, rng, "shexp.w2");
  ASSERT_TRUE(gemv_mma_pair_supports(w1.dev, w3.dev));
  set_mma_precision(MmaPrecision::kBf16x3);
  for (int64_t T : {1, 3}) {
    std::vector<float> x = randn(size_t(T * D), rng);
    for (float& v : x) v *= 20.0f;  // gate values past the clamp
    std::vector<double> sg, su, sd;
    const std::vector<float> g = host_product(w1.host, x, T, sg), u = host_product(w3.host, x, T, su);
    auto dx = upload_vector(x, "x");
    auto dgu = upload_vector(std::vector<float>(size_t(2 * T * I), std::nanf("")), "gate/up");
    auto dy = upload_vector(std::vector<float>(size_t(T * D), std::nanf("")), "y");
    ASSERT_TRUE(dx.is_ok() && dgu.is_ok() && dy.is_ok());
    float* dg = dgu->as<float>();
    float* du = dg + T * I;
    PairOptions po;
    po.max_blocks = 3;  // the cap the decode MoE passes, smaller than the grid
    ASSERT_TRUE(gemv_mma_pair(w1.dev, w3.dev, dx->as<float>(), D, T, dg, I, du, I, nullptr, po).is_ok());
    auto gu = download_vector(dg, size_t(2 * T * I), "gate/up");
    ASSERT_TRUE(gu.is_ok());
    const std::vector<float> got_g(gu->begin(), gu->begin() + T * I), got_u(gu->begin() + T * I, gu->end());
    EXPECT_LE(rel_to_size(got_g, g, sg), kTolExact) << "gate, T=" << T;
    EXPECT_LE(rel_to_size(got_u, u, su), kTolExact) << "up, T=" << T;
    // The down projection from the GPU's own gate / up values.
    std::vector<float> act(size_t(T * I));
    int clamped = 0;
    for (size_t i = 0; i < act.size(); ++i) {
      double gv = got_g[i], uv = got_u[i];
      clamped += gv > limit;
      gv = std::min(gv, double(limit)), uv = std::clamp(uv, -double(limit), double(limit));
      act[i] = float(gv / (1.0 + std::exp(-gv)) * uv);
    }
    EXPECT_GT(clamped, 0) << "the clamp is exercised";
    const std::vector<float> want = host_product(w2.host, act, T, sd);
    ASSERT_TRUE(gemv_mma_swiglu(w2.dev, dg, du, I, T, limit, dy->as<float>(), D, 2, nullptr).is_ok());
    auto got = download_vector(dy->as<float>(), size_t(T * D), "y");
    ASSERT_TRUE(got.is_ok());
    EXPECT_LE(rel_to_size(*got, want, sd), kTolExact) << "down, T=" << T << " seed " << seed;
  }
}

// The attention's grouped output projection: group g of R rows reads x's
// slice g (one launch for every group).
TEST(DenseQ8, GroupedRowsReadTheirOwnSlice) {
  AFF_SKIP_WITHOUT_GPU();
  AFF_SEEDED_RNG(seed, rng);
  const int64_t G = 4, R = 48, in = 256, T = 2;
  DenseQ8 q;
  upload_q8(q, G * R, in, rng);
  const std::vector<float> x = randn(size_t(T * G * in), rng);  // token t, group g at t*G*in + g*in
  std::vector<float> want(size_t(T * G * R)), row(static_cast<size_t>(in));
  std::vector<double> size(want.size());
  for (int64_t r = 0; r < G * R; ++r) {
    ref::linear_dequant_row(q.host, r, row.data());
    for (int64_t t = 0; t < T; ++t) {
      double s = 0.0, m = 0.0;
      for (int64_t k = 0; k < in; ++k) {
        const double p = double(row[size_t(k)]) * x[size_t(t * G * in + (r / R) * in + k)];
        s += p, m += p * p;
      }
      want[size_t(t * G * R + r)] = float(s), size[size_t(t * G * R + r)] = std::sqrt(m);
    }
  }
  auto dx = upload_vector(x, "x");
  auto dy = upload_vector(std::vector<float>(want.size(), std::nanf("")), "y");
  ASSERT_TRUE(dx.is_ok() && dy.is_ok());
  set_mma_precision(MmaPrecision::kBf16x3);
  ASSERT_TRUE(gemv_mma(q.dev, 0, G * R, dx->as<float>(), G * in, T, dy->as<float>(), G * R, R, in, nullptr).is_ok());
  auto got = download_vector(dy->as<float>(), want.size(), "y");
  ASSERT_TRUE(got.is_ok());
  EXPECT_LE(rel_to_size(*got, want, size), kTolExact) << "seed " << seed;
}

TEST(DenseQ8, PrefillGemmMatchesReference) {
  AFF_SKIP_WITHOUT_GPU();
  AFF_SEEDED_RNG(seed, rng);
  DenseQ8 q;
  upload_q8(q, 200, 512, rng);
  ASSERT_TRUE(gemm_supports(q.dev, MmaPrecision::kBf16x3));
  const int64_t T = kGemmMinTokens + 9;
  ASSERT_TRUE(linear_uses_gemm(q.dev, T));
  set_mma_precision(MmaPrecision::kBf16x3);
  const std::vector<float> x = randn(size_t(T * 512), rng);
  std::vector<double> size;
  const std::vector<float> want = host_product(q.host, x, T, size);
  const std::vector<float> got = run_gemv(q.dev, x, T);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_LE(rel_to_size(got, want, size), kTolGemm) << "seed " << seed;
}

}  // namespace
}  // namespace aff::cuda
