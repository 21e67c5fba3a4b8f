// The AMX-INT8 batched kernels (Q8_0, Q2_K, Q4_K) against the dequantising reference:
// partial row tiles (rows not a multiple of 16), one and several token tiles (n not a
// multiple of 16), odd block counts. The kernels' decode and scaling run everywhere with
// AVX-512 VBMI through the C++ model of the tile instructions (*_amxemu); on a CPU with
// AMX the hardware kernels must match the model bit for bit, and gemm() must take them
// from the kernel's amx_min_tokens on.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <ostream>
#include <random>
#include <vector>

#include "backend/cpu/act_quant.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/gemv.h"
#include "quant/codec.h"
#include "quant/type_traits.h"
#include "random_blocks.h"

namespace aff::cpu::isa {
#define AFF_TEST_GEMM_DECL(name)                                                                                 \
  void name(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* act, int64_t act_stride, int64_t n, \
            float* y, int64_t ldy)
AFF_TEST_GEMM_DECL(gemm_q8_0_q8_0_amx);
AFF_TEST_GEMM_DECL(gemm_q2k_q8k_amx);
AFF_TEST_GEMM_DECL(gemm_q4k_q8k_amx);
AFF_TEST_GEMM_DECL(gemm_q8_0_q8_0_amxemu);
AFF_TEST_GEMM_DECL(gemm_q2k_q8k_amxemu);
AFF_TEST_GEMM_DECL(gemm_q4k_q8k_amxemu);
#undef AFF_TEST_GEMM_DECL
}  // namespace aff::cpu::isa

namespace aff::cpu {
namespace {

using quant::GgmlType;

// As in gemv_test.cpp: relative to sum |w_i x_i|, the integer block sums are exact and
// the rest is f32 rounding of a few hundred terms.
constexpr double kRelTol = 1e-4;

struct AmxKernel {
  GgmlType type;
  GemmFn hw;
  GemmFn emu;
};
void PrintTo(const AmxKernel& k, std::ostream* os) { *os << quant::ggml_type_name(k.type); }

struct Problem {
  int64_t rows, cols, n, rb, stride, ldy;
  std::vector<uint8_t> w, act;
};

Problem make_problem(GgmlType type, int64_t rows, int64_t blocks, int64_t n, std::mt19937_64& rng) {
  Problem p;
  const ActFormat af = gemv_act_format(type);
  p.rows = rows;
  p.cols = blocks * quant::ggml_traits(type).block_elems;
  p.n = n;
  p.rb = *quant::ggml_row_bytes(type, p.cols);
  p.stride = act_bytes(af, p.cols);
  p.ldy = rows + 5;
  p.w = random_weights(type, rows, p.cols, rng);
  p.act.resize(size_t(n * p.stride));
  for (int64_t t = 0; t < n; ++t) quantize_act(af, random_floats(p.cols, rng), p.act.data() + t * p.stride);
  return p;
}

std::vector<float> run(GemmFn fn, const Problem& p) {
  std::vector<float> y(size_t(p.n * p.ldy), NAN);
  fn(p.w.data(), p.rb, p.rows, p.cols, p.act.data(), p.stride, p.n, y.data(), p.ldy);
  return y;
}

// Every output against the f64 dot of the dequantised row and activation; the columns
// past `rows` in each output row must stay untouched.
void expect_matches_reference(GgmlType type, const Problem& p, const std::vector<float>& y, const char* what) {
  const ActFormat af = gemv_act_format(type);
  std::vector<float> x(size_t(p.cols)), row(size_t(p.cols));
  for (int64_t t = 0; t < p.n; ++t) {
    dequantize_act(af, p.act.data() + t * p.stride, x);
    for (int64_t r = 0; r < p.rows; ++r) {
      ASSERT_TRUE(quant::dequantize_row(type, {p.w.data() + r * p.rb, size_t(p.rb)}, row).is_ok());
      double s = 0.0, m = 0.0;
      for (int64_t i = 0; i < p.cols; ++i) {
        s += double(row[size_t(i)]) * x[size_t(i)];
        m += std::fabs(double(row[size_t(i)]) * x[size_t(i)]);
      }
      ASSERT_NEAR(y[size_t(t * p.ldy + r)], s, kRelTol * m)
          << what << " rows=" << p.rows << " cols=" << p.cols << " n=" << p.n << " token=" << t << " row=" << r;
    }
    for (int64_t r = p.rows; r < p.ldy && t + 1 < p.n; ++r) ASSERT_TRUE(std::isnan(y[size_t(t * p.ldy + r)])) << what;
  }
}

class GemmAmxTest : public ::testing::TestWithParam<AmxKernel> {};

TEST_P(GemmAmxTest, TileModelMatchesDequantisedReference) {
  if (!cpu_features().avx512_vbmi) GTEST_SKIP() << "this CPU lacks AVX-512 VBMI, which the AMX kernels' decode needs";
  const AmxKernel k = GetParam();
  std::mt19937_64 rng(std::random_device{}());
  for (int64_t rows : {int64_t(1), int64_t(16), int64_t(37)}) {
    for (int64_t blocks : {int64_t(1), int64_t(3)}) {
      for (int64_t n : {int64_t(1), int64_t(5), int64_t(16), int64_t(21)}) {
        const Problem p = make_problem(k.type, rows, blocks, n, rng);
        expect_matches_reference(k.type, p, run(k.emu, p), "tile model");
      }
    }
  }
}

TEST_P(GemmAmxTest, HardwareMatchesTheTileModelBitForBit) {
  if (!cpu_features().amx_int8 || !cpu_features().avx512_vbmi) {
    GTEST_SKIP() << "this CPU (or OS) offers no AMX-INT8 tiles with AVX-512 VBMI";
  }
  const AmxKernel k = GetParam();
  std::mt19937_64 rng(std::random_device{}());
  for (int64_t rows : {int64_t(7), int64_t(48), int64_t(301)}) {
    for (int64_t n : {int64_t(3), int64_t(16), int64_t(40)}) {
      const Problem p = make_problem(k.type, rows, 5, n, rng);
      const std::vector<float> hw = run(k.hw, p), emu = run(k.emu, p);
      EXPECT_EQ(0, std::memcmp(hw.data(), emu.data(), hw.size() * sizeof(float))) << "rows=" << rows << " n=" << n;
      expect_matches_reference(k.type, p, hw, "hardware");
    }
  }
}

// gemm() hands n >= amx_min_tokens tokens to the AMX kernel exactly where the CPU has
// AMX, and its results are then that kernel's.
TEST_P(GemmAmxTest, GemmTakesTheAmxKernelFromItsThreshold) {
  const AmxKernel k = GetParam();
  const GemvKernel* sel = select_gemv_kernel(k.type, cpu_features());
  ASSERT_NE(sel, nullptr);
  if (sel->amx_fn == nullptr) GTEST_SKIP() << "the selected kernel " << sel->name << " has no AMX form";
  EXPECT_EQ(sel->amx_fn, k.hw);
  ASSERT_GE(sel->amx_min_tokens, 2);
  const bool amx = cpu_features().amx_int8 && cpu_features().avx512_vbmi;
  EXPECT_FALSE(gemm_uses_amx(*sel, sel->amx_min_tokens - 1));
  EXPECT_EQ(gemm_uses_amx(*sel, sel->amx_min_tokens), amx);
  EXPECT_EQ(gemm_uses_amx(*sel, 64), amx);
  if (!amx) GTEST_SKIP() << "this CPU (or OS) offers no AMX-INT8 tiles with AVX-512 VBMI";
  std::mt19937_64 rng(std::random_device{}());
  const Problem p = make_problem(k.type, 301, 5, sel->amx_min_tokens + 9, rng);
  std::vector<float> y(size_t(p.n * p.ldy), NAN);
  gemm(*sel, p.w.data(), p.rb, p.rows, p.cols, p.act.data(), p.stride, p.n, y.data(), p.ldy);
  const std::vector<float> direct = run(k.hw, p);
  EXPECT_EQ(0, std::memcmp(y.data(), direct.data(), y.size() * sizeof(float)));
}

INSTANTIATE_TEST_SUITE_P(Types, GemmAmxTest,
                         ::testing::Values(AmxKernel{GgmlType::kQ8_0, isa::gemm_q8_0_q8_0_amx, isa::gemm_q8_0_q8_0_amxemu},
                                           AmxKernel{GgmlType::kQ2_K, isa::gemm_q2k_q8k_amx, isa::gemm_q2k_q8k_amxemu},
                                           AmxKernel{GgmlType::kQ4_K, isa::gemm_q4k_q8k_amx, isa::gemm_q4k_q8k_amxemu}),
                         [](const auto& info) { return std::string(quant::ggml_type_name(info.param.type)); });

}  // namespace
}  // namespace aff::cpu
