// Reference quantisers: quantise fresh random rows, dequantise, and hold the relative RMS
// error to a per-format budget. Budgets are for Gaussian-like weights with a few outliers
// (what LLM weight rows look like), measured from these quantisers with a small margin.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "quant/codec.h"

namespace aff::quant {
namespace {

// Relative RMS error budgets: ||x - deq(q(x))|| / ||x||, pooled over ~50 rows. Measured
// over 15 runs (min..max): Q8_0 .0073-.0077, Q4_K .082-.084, Q3_K .167-.173, Q2_K .279-.284,
// IQ4_XS .092-.096, IQ4_NL .090-.095, MXFP4 .131-.142, BF16 .0016-.0017, F16 .0002.
// Budgets sit ~10% above the worst run.
constexpr double kBudgetQ8_0 = 0.0085;
constexpr double kBudgetQ4_K = 0.092;
constexpr double kBudgetQ3_K = 0.19;
constexpr double kBudgetQ2_K = 0.31;
constexpr double kBudgetIQ4_XS = 0.105;
constexpr double kBudgetIQ4_NL = 0.105;
constexpr double kBudgetMXFP4 = 0.155;
constexpr double kBudgetBF16 = 0.0019;
constexpr double kBudgetF16 = 0.00025;

struct Case {
  GgmlType type;
  double budget;
};

std::vector<float> random_row(std::mt19937& rng, int64_t n) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  const float scale = 0.01f + uni(rng) * 0.2f;
  for (auto& v : x) {
    v = normal(rng) * scale;
    if (uni(rng) < 0.005f) v *= 8.0f;  // occasional outliers, as in real weights
  }
  return x;
}

double weighted_rel_error(const std::vector<float>& x, const std::vector<float>& y,
                          const std::vector<float>* w) {
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double wi = w ? (*w)[i] : 1.0;
    num += wi * double(x[i] - y[i]) * double(x[i] - y[i]);
    den += wi * double(x[i]) * double(x[i]);
  }
  return std::sqrt(num / den);
}

std::vector<float> round_trip(GgmlType type, const std::vector<float>& x,
                              const std::vector<float>* imp) {
  std::vector<uint8_t> q(size_t(*ggml_row_bytes(type, int64_t(x.size()))), 0xCD);
  std::vector<float> y(x.size(), std::nanf(""));
  EXPECT_TRUE(quantize_row(type, x, q, imp ? std::span<const float>(*imp) : std::span<const float>())
                  .is_ok());
  EXPECT_TRUE(dequantize_row(type, q, y).is_ok());
  return y;
}

class QuantRoundTrip : public ::testing::TestWithParam<Case> {};

TEST_P(QuantRoundTrip, WithinBudget) {
  const Case c = GetParam();
  std::mt19937 rng(std::random_device{}());
  // Errors are pooled over many rows so that the budget measures the quantiser, not the
  // luck of one short row; row lengths are odd multiples of the super-block.
  double num = 0, den = 0;
  for (const int64_t blocks : {1, 3, 17}) {
    for (int row = 0; row < 24; ++row) {
      const auto x = random_row(rng, 256 * blocks);
      const auto y = round_trip(c.type, x, nullptr);
      for (size_t i = 0; i < y.size(); ++i) {
        ASSERT_TRUE(std::isfinite(y[i])) << i;
        num += double(x[i] - y[i]) * double(x[i] - y[i]);
        den += double(x[i]) * double(x[i]);
      }
    }
  }
  const double err = std::sqrt(num / den);
  EXPECT_LE(err, c.budget) << ggml_type_name(c.type);
  std::printf("  %-7s rel RMS error %.5f (budget %.5f)\n",
              std::string(ggml_type_name(c.type)).c_str(), err, c.budget);
}

// An importance vector must lower the error where it says the weights matter.
TEST_P(QuantRoundTrip, ImportanceLowersWeightedError) {
  const Case c = GetParam();
  if (c.type == GgmlType::kQ8_0 || c.type == GgmlType::kMXFP4 || !ggml_traits(c.type).quantized) {
    GTEST_SKIP() << "no free parameter for an importance vector to trade";
  }
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  const int64_t n = 256 * 16;
  double plain_sum = 0, weighted_sum = 0;
  for (int trial = 0; trial < 4; ++trial) {
    const auto x = random_row(rng, n);
    std::vector<float> imp(static_cast<size_t>(n));
    for (auto& w : imp) w = uni(rng) < 0.1f ? 50.0f : 0.05f + uni(rng);  // a few hot columns
    plain_sum += weighted_rel_error(x, round_trip(c.type, x, nullptr), &imp);
    weighted_sum += weighted_rel_error(x, round_trip(c.type, x, &imp), &imp);
  }
  EXPECT_LT(weighted_sum, plain_sum * 0.97) << ggml_type_name(c.type);
}

INSTANTIATE_TEST_SUITE_P(
    Formats, QuantRoundTrip,
    ::testing::Values(Case{GgmlType::kQ8_0, kBudgetQ8_0}, Case{GgmlType::kQ4_K, kBudgetQ4_K},
                      Case{GgmlType::kQ3_K, kBudgetQ3_K}, Case{GgmlType::kQ2_K, kBudgetQ2_K},
                      Case{GgmlType::kIQ4_XS, kBudgetIQ4_XS}, Case{GgmlType::kIQ4_NL, kBudgetIQ4_NL},
                      Case{GgmlType::kMXFP4, kBudgetMXFP4}, Case{GgmlType::kBF16, kBudgetBF16},
                      Case{GgmlType::kF16, kBudgetF16}),
    [](const auto& info) { return std::string(ggml_type_name(info.param.type)); });

TEST(QuantizeRow, RejectsBadImportance) {
  std::vector<float> x(256, 1.0f), imp(255, 1.0f);
  std::vector<uint8_t> q(144);
  EXPECT_FALSE(quantize_row(GgmlType::kQ4_K, x, q, imp).is_ok());
  imp.assign(256, 1.0f);
  imp[7] = -1.0f;
  EXPECT_FALSE(quantize_row(GgmlType::kQ4_K, x, q, imp).is_ok());
  imp[7] = 1.0f;
  EXPECT_TRUE(quantize_row(GgmlType::kQ4_K, x, q, imp).is_ok());
  std::vector<uint8_t> iq3s(110);
  EXPECT_EQ(quantize_row(GgmlType::kIQ3_S, x, iq3s).code(), StatusCode::kUnsupported);
}

// All-zero and constant blocks must survive exactly (no NaN from 0/0 scales).
TEST(QuantizeRow, DegenerateBlocks) {
  for (GgmlType t : {GgmlType::kQ8_0, GgmlType::kQ4_K, GgmlType::kQ3_K, GgmlType::kQ2_K,
                     GgmlType::kIQ4_XS, GgmlType::kIQ4_NL, GgmlType::kMXFP4}) {
    std::vector<float> zeros(256, 0.0f);
    const auto y = round_trip(t, zeros, nullptr);
    for (float v : y) ASSERT_EQ(v, 0.0f) << ggml_type_name(t);
    std::vector<float> constant(256, -0.75f);
    const auto yc = round_trip(t, constant, nullptr);
    for (float v : yc) ASSERT_NEAR(v, -0.75f, 0.75f * 0.1f) << ggml_type_name(t);
  }
}

}  // namespace
}  // namespace aff::quant
