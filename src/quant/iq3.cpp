// IQ3_XXS: groups of 4 magnitudes from a 256-entry codebook, sign indices and 4-bit
// scales packed one u32 per 32 elements after the 64 grid-index bytes.
#include <cstring>

#include "core/dtype.h"
#include "quant/formats.h"
#include "quant/ggml_grids.h"

namespace aff::quant {

void dequantize_row_iq3_xxs(const BlockIq3Xxs* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float d = f16_to_f32(x[b].d);
    const uint8_t* grid_idx = x[b].qs;
    for (int ib = 0; ib < 8; ++ib) {
      uint32_t sign_scale;
      std::memcpy(&sign_scale, x[b].qs + kQK_K / 4 + 4 * ib, 4);
      const float db = d * (0.5f + float(sign_scale >> 28)) * 0.5f;
      for (int l = 0; l < 4; ++l) {
        const uint8_t signs = kSignsIq2xs[(sign_scale >> (7 * l)) & 127];
        const uint32_t g[2] = {kIq3xxsGrid[grid_idx[8 * ib + 2 * l]],
                               kIq3xxsGrid[grid_idx[8 * ib + 2 * l + 1]]};
        float* yl = y + b * kQK_K + 32 * ib + 8 * l;
        for (int j = 0; j < 8; ++j) {
          const float mag = float(uint8_t(g[j / 4] >> (8 * (j % 4))));
          yl[j] = db * mag * ((signs >> j) & 1 ? -1.0f : 1.0f);
        }
      }
    }
  }
}

}  // namespace aff::quant
