// The VBMI IQ2_XS, IQ3_XXS, IQ1_S and IQ1_M kernels against the dequantising reference,
// and their batched forms bit-identical to them: random rows (every grid row, sign index,
// delta sign and scale), odd block and row counts, one and several tokens. Called
// directly, so they are checked even where the selector would pick another kernel.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/act_quant.h"
#include "backend/cpu/cpu_features.h"
#include "quant/blocks.h"
#include "quant/codec.h"
#include "quant/type_traits.h"
#include "random_blocks.h"

namespace aff::cpu::isa {
void gemv_iq2xs_q8kt_avx512vbmi(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* act, float* y);
void gemm_iq2xs_q8kt_avx512vbmi(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* act,
                                int64_t act_stride, int64_t n, float* y, int64_t ldy);
void gemv_iq3xxs_q8kt_avx512vbmi(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* act, float* y);
void gemm_iq3xxs_q8kt_avx512vbmi(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* act,
                                 int64_t act_stride, int64_t n, float* y, int64_t ldy);
void gemv_iq1s_q8kt_avx512vbmi(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* act, float* y);
void gemm_iq1s_q8kt_avx512vbmi(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* act,
                               int64_t act_stride, int64_t n, float* y, int64_t ldy);
void gemv_iq1m_q8kt_avx512vbmi(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* act, float* y);
void gemm_iq1m_q8kt_avx512vbmi(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* act,
                               int64_t act_stride, int64_t n, float* y, int64_t ldy);
}  // namespace aff::cpu::isa

namespace aff::cpu {
namespace {

using quant::GgmlType;

struct VbmiKernel {
  GgmlType type;
  void (*gemv)(const uint8_t*, int64_t, int64_t, int64_t, const void*, float*);
  void (*gemm)(const uint8_t*, int64_t, int64_t, int64_t, const void*, int64_t, int64_t, float*, int64_t);
};

class IqVbmiTest : public ::testing::TestWithParam<VbmiKernel> {};

TEST_P(IqVbmiTest, MatchesDequantisedReference) {
  if (!cpu_features().avx512_vbmi) GTEST_SKIP() << "this CPU lacks AVX-512 VBMI";
  const VbmiKernel k = GetParam();
  std::mt19937_64 rng(std::random_device{}());
  for (int64_t blocks : {int64_t(1), int64_t(2), int64_t(3), int64_t(17)}) {
    for (int64_t rows : {int64_t(1), int64_t(7), int64_t(33)}) {
      const int64_t cols = 256 * blocks, rb = *quant::ggml_row_bytes(k.type, cols);
      const auto w = random_weights(k.type, rows, cols, rng);
      std::vector<uint8_t> act(size_t(act_bytes(ActFormat::kQ8KT, cols)));
      quantize_act(ActFormat::kQ8KT, random_floats(cols, rng), act.data());
      std::vector<float> x(static_cast<size_t>(cols)), row(static_cast<size_t>(cols));
      dequantize_act(ActFormat::kQ8KT, act.data(), x);
      std::vector<float> y(size_t(rows), std::numeric_limits<float>::quiet_NaN());
      k.gemv(w.data(), rb, rows, cols, act.data(), y.data());
      for (int64_t r = 0; r < rows; ++r) {
        ASSERT_TRUE(quant::dequantize_row(k.type, {w.data() + r * rb, size_t(rb)}, row).is_ok());
        double s = 0.0, m = 0.0;
        for (int64_t i = 0; i < cols; ++i) {
          s += double(row[size_t(i)]) * x[size_t(i)];
          m += std::fabs(double(row[size_t(i)]) * x[size_t(i)]);
        }
        ASSERT_NEAR(y[size_t(r)], s, 1e-4 * m) << "cols=" << cols << " rows=" << rows << " row=" << r;
      }
    }
  }
}

TEST_P(IqVbmiTest, GemmIsBitIdenticalToGemvPerToken) {
  if (!cpu_features().avx512_vbmi) GTEST_SKIP() << "this CPU lacks AVX-512 VBMI";
  const VbmiKernel k = GetParam();
  std::mt19937_64 rng(std::random_device{}());
  // 17 blocks: IQ2_XS prepares four tokens on the heap, IQ3_XXS on the stack.
  const int64_t rows = 301, cols = 17 * 256, n = 7, ldy = rows + 3;
  const int64_t rb = *quant::ggml_row_bytes(k.type, cols);
  const int64_t stride = act_bytes(ActFormat::kQ8KT, cols);
  const auto w = random_weights(k.type, rows, cols, rng);
  std::vector<uint8_t> act(size_t(n * stride));
  for (int64_t t = 0; t < n; ++t) quantize_act(ActFormat::kQ8KT, random_floats(cols, rng), act.data() + t * stride);
  std::vector<float> y(size_t(n * ldy), NAN), y1(size_t(rows), NAN);
  k.gemm(w.data(), rb, rows, cols, act.data(), stride, n, y.data(), ldy);
  for (int64_t t = 0; t < n; ++t) {
    k.gemv(w.data(), rb, rows, cols, act.data() + t * stride, y1.data());
    EXPECT_EQ(0, std::memcmp(y1.data(), y.data() + t * ldy, size_t(rows) * sizeof(float))) << "token " << t;
  }
}

INSTANTIATE_TEST_SUITE_P(Types, IqVbmiTest,
                         ::testing::Values(VbmiKernel{GgmlType::kIQ2_XS, isa::gemv_iq2xs_q8kt_avx512vbmi,
                                                      isa::gemm_iq2xs_q8kt_avx512vbmi},
                                           VbmiKernel{GgmlType::kIQ3_XXS, isa::gemv_iq3xxs_q8kt_avx512vbmi,
                                                      isa::gemm_iq3xxs_q8kt_avx512vbmi},
                                           VbmiKernel{GgmlType::kIQ1_S, isa::gemv_iq1s_q8kt_avx512vbmi,
                                                      isa::gemm_iq1s_q8kt_avx512vbmi},
                                           VbmiKernel{GgmlType::kIQ1_M, isa::gemv_iq1m_q8kt_avx512vbmi,
                                                      isa::gemm_iq1m_q8kt_avx512vbmi}),
                         [](const auto& info) { return std::string(quant::ggml_type_name(info.param.type)); });

}  // namespace
}  // namespace aff::cpu
