// Random ggml weight rows and activations for the CPU-lane tests: random bytes with every
// scale field set to a sane positive value, so every code point and scale bit pattern
// (including Q8_0's -128) is exercised while the values stay finite.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "quant/blocks.h"
#include "quant/type_traits.h"

namespace aff::cpu {

inline uint16_t random_f16(std::mt19937_64& rng, float lo, float hi) {
  return f32_to_f16(std::uniform_real_distribution<float>(lo, hi)(rng));
}

// Random rows of `type` with every scale field set to a sane positive value.
inline std::vector<uint8_t> random_weights(quant::GgmlType type, int64_t rows, int64_t cols, std::mt19937_64& rng) {
  const int64_t row_bytes = *quant::ggml_row_bytes(type, cols);
  std::vector<uint8_t> w(size_t(rows * row_bytes));
  for (auto& b : w) b = uint8_t(rng());
  const int64_t nb = rows * cols / quant::ggml_traits(type).block_elems;
  for (int64_t i = 0; i < nb; ++i) {
    switch (type) {
      case quant::GgmlType::kQ8_0: reinterpret_cast<quant::BlockQ8_0*>(w.data())[i].d = random_f16(rng, 1e-3f, 2e-2f); break;
      case quant::GgmlType::kQ4_K: {
        auto& b = reinterpret_cast<quant::BlockQ4K*>(w.data())[i];
        b.d = random_f16(rng, 1e-4f, 2e-3f);
        b.dmin = random_f16(rng, 1e-4f, 2e-3f);
        break;
      }
      case quant::GgmlType::kQ2_K: {
        auto& b = reinterpret_cast<quant::BlockQ2K*>(w.data())[i];
        b.d = random_f16(rng, 1e-3f, 1e-2f);
        b.dmin = random_f16(rng, 1e-3f, 1e-2f);
        break;
      }
      case quant::GgmlType::kIQ2_XXS: reinterpret_cast<quant::BlockIq2Xxs*>(w.data())[i].d = random_f16(rng, 1e-3f, 1e-2f); break;
      case quant::GgmlType::kQ3_K: reinterpret_cast<quant::BlockQ3K*>(w.data())[i].d = random_f16(rng, 1e-3f, 1e-2f); break;
      case quant::GgmlType::kIQ4_XS: reinterpret_cast<quant::BlockIq4Xs*>(w.data())[i].d = random_f16(rng, 1e-4f, 1e-3f); break;
      case quant::GgmlType::kMXFP4:
        reinterpret_cast<quant::BlockMxfp4*>(w.data())[i].e = uint8_t(115 + rng() % 20);
        break;
      case quant::GgmlType::kIQ2_XS: reinterpret_cast<quant::BlockIq2Xs*>(w.data())[i].d = random_f16(rng, 1e-3f, 1e-2f); break;
      case quant::GgmlType::kIQ3_XXS:
        reinterpret_cast<quant::BlockIq3Xxs*>(w.data())[i].d = random_f16(rng, 1e-3f, 1e-2f);
        break;
      case quant::GgmlType::kIQ1_S: reinterpret_cast<quant::BlockIq1S*>(w.data())[i].d = random_f16(rng, 1e-3f, 1e-2f); break;
      case quant::GgmlType::kIQ1_M: {
        // The f16 super-scale is spread over the top nibbles of the four scale words.
        auto& b = reinterpret_cast<quant::BlockIq1M*>(w.data())[i];
        const uint16_t d = random_f16(rng, 1e-3f, 1e-2f);
        uint16_t sc[4];
        std::memcpy(sc, b.scales, sizeof(sc));
        for (int k = 0; k < 4; ++k) sc[k] = uint16_t((sc[k] & 0x0fff) | (((d >> (4 * k)) & 0xf) << 12));
        std::memcpy(b.scales, sc, sizeof(sc));
        break;
      }
      default: ADD_FAILURE() << "no generator";
    }
  }
  return w;
}

inline std::vector<float> random_floats(int64_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = nd(rng);
  return x;
}

}  // namespace aff::cpu
