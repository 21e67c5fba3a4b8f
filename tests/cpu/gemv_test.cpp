// Every CPU-lane GEMV kernel against the scalar reference: dequantise each weight row
// with the ggml-compatible codec, dequantise the quantised activation, dot in f64.
// Weights are random bytes with sane scale fields, so every code point and scale bit
// pattern (including Q8_0's -128) is exercised; sizes are odd block counts and odd rows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/act_quant.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/gemv.h"
#include "core/dtype.h"
#include "quant/blocks.h"
#include "quant/codec.h"
#include "random_blocks.h"

namespace aff::cpu {
namespace {

using quant::GgmlType;

constexpr GgmlType kTypes[] = {GgmlType::kQ8_0,   GgmlType::kQ4_K,    GgmlType::kQ2_K,  GgmlType::kQ3_K,
                               GgmlType::kIQ2_XXS, GgmlType::kIQ4_XS, GgmlType::kMXFP4,  GgmlType::kIQ2_XS,
                               GgmlType::kIQ3_XXS, GgmlType::kIQ1_S,  GgmlType::kIQ1_M};

// Relative to sum |w_i x_i|: integer block sums are exact in both, the rest is f32
// rounding of a few hundred terms (an indexing bug errs by ~1/sqrt(n) of it).
constexpr double kRelTol = 1e-4;

struct Reference {
  std::vector<double> y;
  std::vector<double> mag;  // sum |w_i x_i| per row
};

Reference reference_gemv(GgmlType type, const std::vector<uint8_t>& w, int64_t rows, int64_t cols, ActFormat af,
                         const std::vector<uint8_t>& act) {
  const int64_t row_bytes = *quant::ggml_row_bytes(type, cols);
  std::vector<float> x(static_cast<size_t>(cols)), row(static_cast<size_t>(cols));
  dequantize_act(af, act.data(), x);
  Reference ref;
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_TRUE(quant::dequantize_row(type, {w.data() + r * row_bytes, size_t(row_bytes)}, row).is_ok());
    double s = 0.0, m = 0.0;
    for (int64_t i = 0; i < cols; ++i) {
      s += double(row[size_t(i)]) * x[size_t(i)];
      m += std::fabs(double(row[size_t(i)]) * x[size_t(i)]);
    }
    ref.y.push_back(s);
    ref.mag.push_back(m);
  }
  return ref;
}

class GemvKernelTest : public ::testing::TestWithParam<GgmlType> {};

TEST_P(GemvKernelTest, EveryIsaMatchesDequantisedReference) {
  const GgmlType type = GetParam();
  ASSERT_TRUE(gemv_has_kernels(type));
  const int64_t be = quant::ggml_traits(type).block_elems;
  std::mt19937_64 rng(std::random_device{}());
  const auto kernels = gemv_kernels(type);
  ASSERT_GE(kernels.size(), 2u);  // scalar and at least one SIMD ISA
  int ran = 0;
  for (const auto& k : kernels) {
    if (!isa_supported(k.isa, cpu_features())) {
      std::printf("[  SKIP    ] %s: this CPU lacks %s\n", std::string(k.name).c_str(),
                  std::string(isa_name(k.isa)).c_str());
      continue;
    }
    ++ran;
    const ActFormat af = k.act;  // kernels of one type may take different activation orders
    for (int64_t blocks : {int64_t(1), int64_t(3), be == 32 ? int64_t(97) : int64_t(17)}) {
      for (int64_t rows : {int64_t(1), int64_t(7), int64_t(33)}) {
        const int64_t cols = blocks * be;
        const auto w = random_weights(type, rows, cols, rng);
        const auto x = random_floats(cols, rng);
        std::vector<uint8_t> act(size_t(act_bytes(af, cols)));
        quantize_act(af, x, act.data());
        const Reference ref = reference_gemv(type, w, rows, cols, af, act);
        std::vector<float> y(size_t(rows), std::numeric_limits<float>::quiet_NaN());
        k.fn(w.data(), *quant::ggml_row_bytes(type, cols), rows, cols, act.data(), y.data());
        for (int64_t r = 0; r < rows; ++r) {
          ASSERT_GT(ref.mag[size_t(r)], 0.0);
          ASSERT_NEAR(y[size_t(r)], ref.y[size_t(r)], kRelTol * ref.mag[size_t(r)])
              << k.name << " cols=" << cols << " rows=" << rows << " row=" << r;
        }
      }
    }
  }
  EXPECT_GE(ran, 1);
}

TEST_P(GemvKernelTest, ParallelSplitIsBitIdenticalToOneThread) {
  const GgmlType type = GetParam();
  const GemvKernel* k = select_gemv_kernel(type, cpu_features());
  ASSERT_NE(k, nullptr);
  std::mt19937_64 rng(std::random_device{}());
  const int64_t rows = 101, cols = 3 * 256;
  const auto w = random_weights(type, rows, cols, rng);
  const auto x = random_floats(cols, rng);
  std::vector<uint8_t> act(size_t(act_bytes(k->act, cols)));
  quantize_act(k->act, x, act.data());
  const int64_t rb = *quant::ggml_row_bytes(type, cols);
  std::vector<float> y1(size_t(rows), NAN), y3(size_t(rows), NAN);
  gemv_parallel(*k, w.data(), rb, rows, cols, act.data(), y1.data(), 1);
  gemv_parallel(*k, w.data(), rb, rows, cols, act.data(), y3.data(), 3);
  EXPECT_EQ(0, std::memcmp(y1.data(), y3.data(), y1.size() * sizeof(float)));
}

// The fused (VNNI) batched kernels; the AMX ones, which round differently, are checked in
// gemm_amx_test.cpp.
TEST_P(GemvKernelTest, GemmIsBitIdenticalToGemvPerToken) {
  const GgmlType type = GetParam();
  const GemvKernel* sel = select_gemv_kernel(type, cpu_features());
  ASSERT_NE(sel, nullptr);
  GemvKernel vnni = *sel;
  vnni.amx_fn = nullptr;
  const GemvKernel* k = &vnni;
  std::mt19937_64 rng(std::random_device{}());
  // 1100 rows of 5*256 Q8_0 inputs span several 256 KiB row tiles.
  const int64_t rows = 1100, cols = 5 * 256, n = 7, ldy = rows + 3;
  const int64_t rb = *quant::ggml_row_bytes(type, cols);
  const int64_t stride = act_bytes(k->act, cols);
  const auto w = random_weights(type, rows, cols, rng);
  std::vector<uint8_t> act(size_t(n * stride));
  for (int64_t t = 0; t < n; ++t) quantize_act(k->act, random_floats(cols, rng), act.data() + t * stride);
  std::vector<float> y(size_t(n * ldy), NAN), y1(size_t(rows), NAN);
  gemm(*k, w.data(), rb, rows, cols, act.data(), stride, n, y.data(), ldy);
  for (int64_t t = 0; t < n; ++t) {
    k->fn(w.data(), rb, rows, cols, act.data() + t * stride, y1.data());
    EXPECT_EQ(0, std::memcmp(y1.data(), y.data() + t * ldy, size_t(rows) * sizeof(float))) << "token " << t;
    for (int64_t r = rows; r < ldy && t + 1 < n; ++r) EXPECT_TRUE(std::isnan(y[size_t(t * ldy + r)]));
  }
}

INSTANTIATE_TEST_SUITE_P(Types, GemvKernelTest, ::testing::ValuesIn(kTypes),
                         [](const auto& info) { return std::string(quant::ggml_type_name(info.param)); });

// The expected pick per CPU feature level: the fastest ISA with a kernel for the type.
Isa expected_isa(GgmlType t, const CpuFeatures& f) {
  for (const auto& k : gemv_kernels(t)) {
    if (isa_supported(k.isa, f)) return k.isa;
  }
  return Isa::kScalar;
}

TEST(GemvSelect, PicksTheBestIsaTheCpuHasAndFallsBack) {
  const CpuFeatures& f = cpu_features();
  for (GgmlType t : kTypes) {
    const GemvKernel* k = select_gemv_kernel(t, f);
    ASSERT_NE(k, nullptr);
    // Kernels are listed fastest first, wider ISAs before narrower ones.
    const auto ks = gemv_kernels(t);
    for (size_t i = 1; i < ks.size(); ++i) EXPECT_GE(int(ks[i - 1].isa), int(ks[i].isa)) << ks[i].name;
    EXPECT_EQ(ks.back().isa, Isa::kScalar);
    EXPECT_EQ(k->isa, expected_isa(t, f)) << k->name;
    if (f.avx512_vbmi) {
      EXPECT_GE(int(k->isa), int(Isa::kAvx512)) << k->name;
    }
    const GemvKernel* s = select_gemv_kernel(t, cpu_features_without(f, "avx2"));
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->isa, Isa::kScalar);
    const Isa no512 = select_gemv_kernel(t, cpu_features_without(f, "avx512"))->isa;
    EXPECT_LE(int(no512), int(Isa::kAvx2));
    EXPECT_EQ(no512, f.avx2 ? Isa::kAvx2 : Isa::kScalar) << "every type has an AVX2 kernel";
    EXPECT_NE(select_gemv_kernel(t, cpu_features_without(f, "vbmi"))->isa, Isa::kAvx512Vbmi);
  }
  EXPECT_EQ(select_gemv_kernel(GgmlType::kQ5_K, f), nullptr);
  EXPECT_FALSE(gemv_has_kernels(GgmlType::kF16));
}

TEST(ActQuant, TransposedGroupOrderHoldsTheSameValues) {
  std::mt19937_64 rng(std::random_device{}());
  const auto x = random_floats(2 * 256, rng);
  std::vector<ActQ8K> nat(2), tr(2);
  quantize_act(ActFormat::kQ8K, x, nat.data());
  quantize_act(ActFormat::kQ8KT, x, tr.data());
  for (int b = 0; b < 2; ++b) {
    EXPECT_EQ(nat[size_t(b)].d, tr[size_t(b)].d);
    EXPECT_EQ(0, std::memcmp(nat[size_t(b)].bsums, tr[size_t(b)].bsums, sizeof(tr[0].bsums)));
    // Step k, qword g, byte j holds input 32g + 8k + j.
    for (int k = 0; k < 4; ++k) {
      for (int g = 0; g < 8; ++g) {
        for (int j = 0; j < 8; ++j) {
          ASSERT_EQ(tr[size_t(b)].qs[64 * k + 8 * g + j], nat[size_t(b)].qs[32 * g + 8 * k + j]);
        }
      }
    }
  }
  std::vector<float> back_nat(x.size()), back_tr(x.size());
  dequantize_act(ActFormat::kQ8K, nat.data(), back_nat);
  dequantize_act(ActFormat::kQ8KT, tr.data(), back_tr);
  EXPECT_EQ(back_nat, back_tr);
}

TEST(ActQuant, BlockSumsAndRangeHold) {
  std::mt19937_64 rng(std::random_device{}());
  const auto x = random_floats(3 * 256, rng);
  std::vector<ActQ8K> a(3);
  quantize_act(ActFormat::kQ8K, x, a.data());
  std::vector<float> back(x.size());
  dequantize_act(ActFormat::kQ8K, a.data(), back);
  for (const auto& b : a) {
    for (int i = 0; i < 16; ++i) {
      int s = 0;
      for (int j = 0; j < 16; ++j) {
        s += b.qs[16 * i + j];
        EXPECT_GE(b.qs[16 * i + j], -127);
      }
      EXPECT_EQ(s, b.bsums[i]);
    }
  }
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(back[i], x[i], a[i / 256].d * 0.5f + 1e-7f);
}

}  // namespace
}  // namespace aff::cpu
