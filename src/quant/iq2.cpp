// IQ2_XXS and IQ2_XS: groups of 8 magnitudes taken from a codebook (the E8 lattice points
// the grids list), signs from a 7-bit index with implied even parity, 4-bit sub-scales.
#include <cstring>

#include "core/dtype.h"
#include "quant/formats.h"
#include "quant/ggml_grids.h"

namespace aff::quant {
namespace {

// Writes 8 values db * grid[j] * sign_j for one codebook entry and 7-bit sign index.
inline void emit8(float db, uint64_t grid, uint8_t sign_index, float* y) {
  const uint8_t signs = kSignsIq2xs[sign_index];
  for (int j = 0; j < 8; ++j) {
    const float g = float(uint8_t(grid >> (8 * j)));
    y[j] = db * g * ((signs >> j) & 1 ? -1.0f : 1.0f);
  }
}

}  // namespace

void dequantize_row_iq2_xxs(const BlockIq2Xxs* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float d = f16_to_f32(x[b].d);
    for (int ib = 0; ib < 8; ++ib) {
      uint32_t grid_idx, sign_scale;  // two u32 words per 32 elements
      std::memcpy(&grid_idx, x[b].qs + 4 * ib, 4);
      std::memcpy(&sign_scale, x[b].qs + 4 * ib + 2, 4);
      const float db = d * (0.5f + float(sign_scale >> 28)) * 0.25f;
      for (int l = 0; l < 4; ++l) {
        emit8(db, kIq2xxsGrid[(grid_idx >> (8 * l)) & 0xff], uint8_t((sign_scale >> (7 * l)) & 127),
              y + b * kQK_K + 32 * ib + 8 * l);
      }
    }
  }
}

void dequantize_row_iq2_xs(const BlockIq2Xs* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float d = f16_to_f32(x[b].d);
    for (int ib = 0; ib < 8; ++ib) {
      const float db[2] = {d * (0.5f + float(x[b].scales[ib] & 0x0f)) * 0.25f,
                           d * (0.5f + float(x[b].scales[ib] >> 4)) * 0.25f};
      for (int l = 0; l < 4; ++l) {
        const uint16_t q = x[b].qs[4 * ib + l];  // 9-bit grid index | 7-bit sign index << 9
        emit8(db[l / 2], kIq2xsGrid[q & 511], uint8_t(q >> 9), y + b * kQK_K + 32 * ib + 8 * l);
      }
    }
  }
}

}  // namespace aff::quant
