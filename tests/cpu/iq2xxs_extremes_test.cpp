// IQ2_XXS kernels at the edges of their integer ranges: every input at full scale
// (|q| = 127, one sign per group or random signs), every group scale 15, grid rows of the
// largest magnitude. The VBMI kernel biases its weights by +64 and starts each group
// from -64 * (sum of the group's inputs), so a group whose inputs all share one sign is
// where a wrong correction or an overflowing accumulator would show.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "backend/cpu/act_quant.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/gemv.h"
#include "core/dtype.h"
#include "quant/blocks.h"
#include "quant/codec.h"
#include "quant/ggml_grids.h"
#include "quant/type_traits.h"

namespace aff::cpu {
namespace {

using quant::GgmlType;

// Grid rows whose eight magnitudes are all 43 or, failing that, the largest sums.
std::vector<uint8_t> heaviest_grid_rows() {
  std::vector<std::pair<int, int>> by_sum;
  for (int i = 0; i < 256; ++i) {
    int s = 0;
    for (int j = 0; j < 8; ++j) s += int(uint8_t(quant::kIq2xxsGrid[i] >> (8 * j)));
    by_sum.push_back({-s, i});
  }
  std::sort(by_sum.begin(), by_sum.end());
  std::vector<uint8_t> rows;
  for (int i = 0; i < 8; ++i) rows.push_back(uint8_t(by_sum[size_t(i)].second));
  return rows;
}

// Rows of IQ2_XXS blocks: heavy grid rows, random sign indices, every scale 15.
std::vector<uint8_t> heavy_weights(int64_t rows, int64_t cols, std::mt19937_64& rng) {
  const auto heavy = heaviest_grid_rows();
  const int64_t nb = rows * cols / 256;
  std::vector<uint8_t> w(size_t(nb) * sizeof(quant::BlockIq2Xxs));
  auto* b = reinterpret_cast<quant::BlockIq2Xxs*>(w.data());
  for (int64_t i = 0; i < nb; ++i) {
    b[i].d = f32_to_f16(std::uniform_real_distribution<float>(1e-3f, 1e-2f)(rng));
    for (int g = 0; g < 8; ++g) {
      uint32_t idx = 0, aux = 15u << 28;  // scale 15
      for (int k = 0; k < 4; ++k) {
        idx |= uint32_t(heavy[rng() % heavy.size()]) << (8 * k);
        aux |= uint32_t(rng() % 128) << (7 * k);
      }
      std::memcpy(&b[i].qs[4 * g], &idx, 4);
      std::memcpy(&b[i].qs[4 * g + 2], &aux, 4);
    }
  }
  return w;
}

// x: every input ±1 (|q| = 127 after quantisation); sign per group of 32 (same_sign) or
// per input.
std::vector<float> full_scale_inputs(int64_t cols, bool same_sign, std::mt19937_64& rng) {
  std::vector<float> x(static_cast<size_t>(cols));
  float s = 1.0f;
  for (int64_t i = 0; i < cols; ++i) {
    if (!same_sign || i % 32 == 0) s = (rng() & 1) ? 1.0f : -1.0f;
    x[size_t(i)] = s;
  }
  return x;
}

TEST(Iq2XxsExtremes, EveryIsaMatchesReferenceAtFullScale) {
  std::mt19937_64 rng(std::random_device{}());
  int ran = 0;
  for (const auto& k : gemv_kernels(GgmlType::kIQ2_XXS)) {
    if (!isa_supported(k.isa, cpu_features())) continue;
    ++ran;
    for (int64_t blocks : {int64_t(1), int64_t(2), int64_t(5)}) {
      for (bool same_sign : {true, false}) {
        const int64_t rows = 9, cols = 256 * blocks, rb = *quant::ggml_row_bytes(GgmlType::kIQ2_XXS, cols);
        const auto w = heavy_weights(rows, cols, rng);
        const auto x = full_scale_inputs(cols, same_sign, rng);
        std::vector<uint8_t> act(size_t(act_bytes(k.act, cols)));
        quantize_act(k.act, x, act.data());
        std::vector<float> xq(static_cast<size_t>(cols)), row(static_cast<size_t>(cols));
        dequantize_act(k.act, act.data(), xq);
        std::vector<float> y(size_t(rows), std::numeric_limits<float>::quiet_NaN());
        k.fn(w.data(), rb, rows, cols, act.data(), y.data());
        for (int64_t r = 0; r < rows; ++r) {
          ASSERT_TRUE(quant::dequantize_row(GgmlType::kIQ2_XXS, {w.data() + r * rb, size_t(rb)}, row).is_ok());
          double s = 0.0, m = 0.0;
          for (int64_t i = 0; i < cols; ++i) {
            s += double(row[size_t(i)]) * xq[size_t(i)];
            m += std::fabs(double(row[size_t(i)]) * xq[size_t(i)]);
          }
          ASSERT_NEAR(y[size_t(r)], s, 1e-4 * m) << k.name << " blocks=" << blocks << " same_sign=" << same_sign
                                                 << " row=" << r;
        }
      }
    }
  }
  EXPECT_GE(ran, 1);
}

}  // namespace
}  // namespace aff::cpu
