// The CPU lane as the reference linear's fast path: the same Linear computed with the
// lane on and off (cpu::set_cpu_lane_enabled) must agree within the activation
// quantisation bound, for every type with a kernel, odd shapes, row ranges with strides,
// and must not depend on the thread count.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/act_quant.h"
#include "backend/cpu/gemv.h"
#include "backend/cpu/linear_fast.h"
#include "backend/ref/linear.h"
#include "quant/codec.h"
#include "random_blocks.h"

namespace aff::cpu {
namespace {

using quant::GgmlType;

constexpr GgmlType kTypes[] = {GgmlType::kQ8_0,   GgmlType::kQ4_K,    GgmlType::kQ2_K,  GgmlType::kQ3_K,
                               GgmlType::kIQ2_XXS, GgmlType::kIQ4_XS, GgmlType::kMXFP4,  GgmlType::kIQ2_XS,
                               GgmlType::kIQ3_XXS, GgmlType::kIQ1_S,  GgmlType::kIQ1_M};

// Activation quantisation: x_i is rounded to a multiple of d = max|x_block| / 127, so
// |x_i - x^_i| <= d/2 and |y_fast - y_ref| <= sum_i |W_i| * max|x_block(i)| * kHalfStep.
constexpr double kHalfStep = 0.5 / 127.0;
// On top of that bound: f32 accumulation in both paths, relative to sum |W_i x_i| (a
// few thousand f32 terms; an indexing error is of the order of the whole sum).
constexpr double kF32Rel = 2e-5;

struct Fixture {
  std::vector<uint8_t> bytes;
  dsv4::Linear lin;
};

Fixture make_linear(GgmlType type, int64_t out, int64_t in, std::mt19937_64& rng) {
  Fixture f;
  f.bytes = random_weights(type, out, in, rng);
  const int64_t rb = *quant::ggml_row_bytes(type, in);
  TensorView& v = f.lin.weight;
  v.name = "test.weight";
  v.dtype = DType::kU8;
  v.shape = {out, rb};
  v.data = f.bytes.data();
  v.nbytes = f.bytes.size();
  f.lin.format = dsv4::WeightFormat::kGgml;
  f.lin.ggml_type = int(type);
  f.lin.out = out;
  f.lin.in = in;
  return f;
}

// Restores the lane switch whatever a test does.
struct LaneGuard {
  bool was = cpu_lane_enabled();
  ~LaneGuard() { set_cpu_lane_enabled(was); }
};

class LinearFastTest : public ::testing::TestWithParam<GgmlType> {
 protected:
  void SetUp() override {
    const dsv4::Linear probe = make_linear(GetParam(), 1, 256, rng_).lin;
    if (!linear_fast_supported(probe)) GTEST_SKIP() << "no SIMD kernel for this type on this CPU";
  }
  std::mt19937_64 rng_{std::random_device{}()};
};

TEST_P(LinearFastTest, MatchesReferenceWithinActivationQuantisationBound) {
  const GgmlType type = GetParam();
  const int64_t be = quant::ggml_traits(type).block_elems;
  const int64_t ab = act_block_elems(gemv_act_format(type));
  LaneGuard guard;
  for (int64_t T : {int64_t(1), int64_t(3), int64_t(8), int64_t(13)}) {
    const int64_t out = 37, in = be == 32 ? 41 * 32 : 3 * 256;  // odd block counts
    Fixture f = make_linear(type, out, in, rng_);
    const auto x = random_floats(T * in, rng_);
    std::vector<float> fast(static_cast<size_t>(T * out), NAN), slow(static_cast<size_t>(T * out), NAN);
    std::vector<float> wrow(static_cast<size_t>(in));
    set_cpu_lane_enabled(true);
    ref::linear(f.lin, x.data(), T, fast.data());
    set_cpu_lane_enabled(false);
    ref::linear(f.lin, x.data(), T, slow.data());
    double worst = 0.0;  // largest error as a fraction of its bound
    for (int64_t r = 0; r < out; ++r) {
      ref::linear_dequant_row(f.lin, r, wrow.data());
      for (int64_t t = 0; t < T; ++t) {
        const float* xt = x.data() + t * in;
        double bound = 0.0, mag = 0.0;
        for (int64_t b0 = 0; b0 < in; b0 += ab) {
          double amax = 0.0;
          for (int64_t i = b0; i < b0 + ab; ++i) amax = std::max(amax, std::fabs(double(xt[i])));
          for (int64_t i = b0; i < b0 + ab; ++i) {
            bound += std::fabs(double(wrow[size_t(i)])) * amax * kHalfStep;
            mag += std::fabs(double(wrow[size_t(i)]) * xt[i]);
          }
        }
        bound += kF32Rel * mag;
        const double err = std::fabs(double(fast[size_t(t * out + r)]) - slow[size_t(t * out + r)]);
        ASSERT_LE(err, bound) << quant::ggml_type_name(type) << " T=" << T << " row=" << r << " token=" << t;
        worst = std::max(worst, err / bound);
      }
    }
    // The bound is a worst case; random rounding errors cancel, so typical errors sit far
    // below it. Failing this means the two paths agree only by the slack of the bound.
    EXPECT_LT(worst, 0.5) << quant::ggml_type_name(type) << " T=" << T;
  }
}

TEST_P(LinearFastTest, RowRangeWithStridesMatchesTheFullLinear) {
  const GgmlType type = GetParam();
  const int64_t out = 53, in = 5 * 256, T = 5;
  Fixture f = make_linear(type, out, in, rng_);
  const int64_t ldx = in + 7, r0 = 9, r1 = 46, ldy = (r1 - r0) + 5;
  std::vector<float> x(size_t(T * ldx));
  const auto xs = random_floats(T * ldx, rng_);
  std::copy(xs.begin(), xs.end(), x.begin());
  std::vector<float> dense(size_t(T * in));
  for (int64_t t = 0; t < T; ++t) std::copy_n(x.data() + t * ldx, in, dense.data() + t * in);
  LaneGuard guard;
  set_cpu_lane_enabled(true);
  std::vector<float> full(size_t(T * out), NAN), part(size_t(T * ldy), -7.0f);
  ref::linear(f.lin, dense.data(), T, full.data());
  ref::linear_rows(f.lin, r0, r1, x.data(), ldx, T, part.data(), ldy);
  for (int64_t t = 0; t < T; ++t) {
    EXPECT_EQ(0, std::memcmp(full.data() + t * out + r0, part.data() + t * ldy, size_t(r1 - r0) * sizeof(float)))
        << "token " << t;
    for (int64_t j = r1 - r0; j < ldy; ++j) EXPECT_EQ(part[size_t(t * ldy + j)], -7.0f) << "wrote past the range";
  }
}

TEST_P(LinearFastTest, ThreadCountDoesNotChangeABit) {
  const GgmlType type = GetParam();
  // Enough bytes x tokens to cross the lane's threading threshold for every type.
  const int64_t out = 611, in = 2 * 512, T = 6;
  Fixture f = make_linear(type, out, in, rng_);
  const auto x = random_floats(T * in, rng_);
  LaneGuard guard;
  set_cpu_lane_enabled(true);
  const int saved = omp_get_max_threads();
  const int saved_dynamic = omp_get_dynamic();
  omp_set_dynamic(0);  // the team must really have 3 threads
  std::vector<float> y1(size_t(T * out), NAN), y3(size_t(T * out), NAN);
  omp_set_num_threads(1);
  ref::linear(f.lin, x.data(), T, y1.data());
  omp_set_num_threads(3);
  ref::linear(f.lin, x.data(), T, y3.data());
  omp_set_num_threads(saved);
  omp_set_dynamic(saved_dynamic);
  EXPECT_EQ(0, std::memcmp(y1.data(), y3.data(), y1.size() * sizeof(float)));
  // And batching does not matter: token t alone gives the same row of y, bit for bit
  // unless T tokens take the AMX kernel (gemm_uses_amx), which sums the same integer
  // block dots in f32 in another order: then within f32 rounding of sum |W_i x_i|.
  const bool amx = gemm_uses_amx(*select_gemv_kernel(type, cpu_features()), T);
  std::vector<float> yt(static_cast<size_t>(out)), wrow(static_cast<size_t>(in));
  for (int64_t t : {int64_t(0), T - 1}) {
    ref::linear(f.lin, x.data() + t * in, 1, yt.data());
    if (!amx) {
      EXPECT_EQ(0, std::memcmp(yt.data(), y1.data() + t * out, size_t(out) * sizeof(float))) << "token " << t;
      continue;
    }
    for (int64_t r = 0; r < out; ++r) {
      ref::linear_dequant_row(f.lin, r, wrow.data());
      double mag = 0.0;
      for (int64_t i = 0; i < in; ++i) mag += std::fabs(double(wrow[size_t(i)]) * x[size_t(t * in + i)]);
      EXPECT_NEAR(yt[size_t(r)], y1[size_t(t * out + r)], kF32Rel * mag) << "token " << t << " row " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, LinearFastTest, ::testing::ValuesIn(kTypes),
                         [](const auto& info) { return std::string(quant::ggml_type_name(info.param)); });

TEST(LinearFast, DeclinesWhatItCannotCompute) {
  std::mt19937_64 rng(1);
  Fixture q5 = make_linear(GgmlType::kQ8_0, 4, 64, rng);
  q5.lin.ggml_type = int(GgmlType::kQ5_K);  // no kernel: left to the reference
  EXPECT_FALSE(linear_fast_supported(q5.lin));
  float y[4];
  const std::vector<float> x(64, 1.0f);
  EXPECT_FALSE(linear_fast_rows(q5.lin, 0, 4, x.data(), 64, 1, y, 4));
  Fixture q8 = make_linear(GgmlType::kQ8_0, 4, 64, rng);
  LaneGuard guard;
  set_cpu_lane_enabled(false);
  EXPECT_FALSE(linear_fast_rows(q8.lin, 0, 4, x.data(), 64, 1, y, 4));
  dsv4::Linear f32;
  f32.format = dsv4::WeightFormat::kF32;
  EXPECT_FALSE(linear_fast_supported(f32));
}

}  // namespace
}  // namespace aff::cpu
