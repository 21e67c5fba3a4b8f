// rmsnorm, RoPE (plain and YaRN) and activations against definitions in double.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <random>
#include <vector>

#include "backend/ref/activation.h"
#include "backend/ref/norm.h"
#include "backend/ref/rope.h"

namespace aff::ref {
namespace {

std::vector<float> randn(size_t n, std::mt19937_64& rng, float sd = 1.0f) {
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

TEST(RefNorm, WeightedAndUnweightedMatchDouble) {
  std::mt19937_64 rng(std::random_device{}());
  const int64_t rows = 5, n = 97;
  const float eps = 1e-6f;
  for (bool weighted : {true, false}) {
    auto x = randn(size_t(rows * n), rng, 3.0f);
    auto w = randn(size_t(n), rng);
    auto y = x;
    rmsnorm(y.data(), rows, n, weighted ? w.data() : nullptr, eps);
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0.0;
      for (int64_t i = 0; i < n; ++i) ss += double(x[size_t(r * n + i)]) * x[size_t(r * n + i)];
      const double inv = 1.0 / std::sqrt(ss / n + eps);
      for (int64_t i = 0; i < n; ++i) {
        const double want = x[size_t(r * n + i)] * inv * (weighted ? w[size_t(i)] : 1.0);
        EXPECT_NEAR(y[size_t(r * n + i)], want, 1e-5 * (1.0 + std::fabs(want)));
      }
    }
  }
}

// Sanity values of the compressed-layer frequencies (theta 160000, rope_dim 64,
// YaRN factor 16 over 65536, beta 32/1) from v4-model-math.md section 3.2.
TEST(RefRope, YarnFrequenciesMatchSpecValues) {
  YarnParams y;
  y.factor = 16.0;
  y.original_max_position = 65536;
  y.beta_fast = 32.0;
  y.beta_slow = 1.0;
  const std::vector<float> f = rope_inv_freq(160000.0, 64, &y);
  ASSERT_EQ(f.size(), 32u);
  const struct { int i; double v; } want[] = {
      {0, 1.0},           {8, 5.0000001e-2},  {15, 3.6355385e-3}, {16, 2.2656249e-3},
      {20, 2.9697779e-4}, {24, 1.9531251e-5}, {25, 5.3723124e-6}, {31, 5.6805294e-7}};
  for (const auto& w : want) EXPECT_NEAR(f[size_t(w.i)], w.v, 4e-7 * w.v) << "pair " << w.i;
  // Below the ramp the frequency is untouched; above it divided by exactly 16.
  for (int i = 0; i <= 15; ++i) EXPECT_NEAR(f[size_t(i)], std::pow(160000.0, -i / 32.0), 4e-7 * f[size_t(i)]);
  for (int i = 25; i < 32; ++i)
    EXPECT_NEAR(f[size_t(i)], std::pow(160000.0, -i / 32.0) / 16.0, 4e-7 * f[size_t(i)]);
}

TEST(RefRope, PlainFrequencies) {
  const std::vector<float> f = rope_inv_freq(10000.0, 64, nullptr);
  for (int i = 0; i < 32; ++i) EXPECT_NEAR(f[size_t(i)], std::pow(10000.0, -i / 32.0), 4e-7 * f[size_t(i)]);
}

TEST(RefRope, RotatesInterleavedPairsAndInverts) {
  std::mt19937_64 rng(std::random_device{}());
  const std::vector<float> f = rope_inv_freq(10000.0, 18, nullptr);
  const auto v = randn(18, rng);
  for (int64_t pos : {0, 1, 7, 129, 4097}) {
    auto r = v;
    rope_apply(r.data(), f, pos, false);
    for (size_t i = 0; i < f.size(); ++i) {
      const double a = double(float(pos) * f[i]);
      const double c = std::cos(a), s = std::sin(a);
      EXPECT_NEAR(r[2 * i], v[2 * i] * c - v[2 * i + 1] * s, 2e-5);
      EXPECT_NEAR(r[2 * i + 1], v[2 * i + 1] * c + v[2 * i] * s, 2e-5);
    }
    rope_apply(r.data(), f, pos, true);
    for (size_t i = 0; i < v.size(); ++i) EXPECT_NEAR(r[i], v[i], 1e-5);
  }
}

// q.k after RoPE depends only on the distance between the two positions.
TEST(RefRope, DotProductIsRelative) {
  std::mt19937_64 rng(std::random_device{}());
  YarnParams y{16.0, 65536, 32.0, 1.0};
  const std::vector<float> f = rope_inv_freq(160000.0, 16, &y);
  const auto q = randn(16, rng), k = randn(16, rng);
  auto dot_at = [&](int64_t pq, int64_t pk) {
    auto a = q, b = k;
    rope_apply(a.data(), f, pq, false);
    rope_apply(b.data(), f, pk, false);
    double s = 0.0;
    for (int i = 0; i < 16; ++i) s += double(a[size_t(i)]) * b[size_t(i)];
    return s;
  };
  EXPECT_NEAR(dot_at(10, 3), dot_at(110, 103), 1e-4);
  EXPECT_NEAR(dot_at(57, 57), dot_at(0, 0), 1e-4);
}

TEST(RefActivation, SoftplusSiluSoftmax) {
  EXPECT_FLOAT_EQ(softplus(25.0f), 25.0f);  // PyTorch threshold 20: identity
  EXPECT_NEAR(softplus(0.0f), std::log(2.0), 1e-7);
  EXPECT_NEAR(softplus(-30.0f), std::exp(-30.0), 1e-18);
  EXPECT_NEAR(silu(1.5f), 1.5 / (1.0 + std::exp(-1.5)), 1e-6);
  std::mt19937_64 rng(std::random_device{}());
  auto x = randn(13, rng, 4.0f);
  x[3] = -INFINITY;
  auto p = x;
  softmax(p.data(), 13);
  double z = 0.0;
  for (int i = 0; i < 13; ++i) z += std::isinf(x[size_t(i)]) ? 0.0 : std::exp(double(x[size_t(i)]));
  for (int i = 0; i < 13; ++i) {
    const double want = std::isinf(x[size_t(i)]) ? 0.0 : std::exp(double(x[size_t(i)])) / z;
    EXPECT_NEAR(p[size_t(i)], want, 1e-6);
  }
}

}  // namespace
}  // namespace aff::ref
