// IQ1_S and IQ1_M: groups of 8 ternary values {-1,0,1} from a 2048-entry codebook,
// shifted by ±1/8 (the "delta") and scaled by odd 3-bit sub-scales (2s+1).
#include <cstring>

#include "core/dtype.h"
#include "quant/formats.h"
#include "quant/ggml_grids.h"

namespace aff::quant {
namespace {

inline void emit8(float dl, float delta, uint16_t grid_index, float* y) {
  const uint64_t g = kIq1sGrid[grid_index];
  for (int j = 0; j < 8; ++j) y[j] = dl * (float(int8_t(uint8_t(g >> (8 * j)))) + delta);
}

}  // namespace

void dequantize_row_iq1_s(const BlockIq1S* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float d = f16_to_f32(x[b].d);
    for (int ib = 0; ib < 8; ++ib) {
      const uint16_t qh = x[b].qh[ib];
      const float dl = d * float(2 * ((qh >> 12) & 7) + 1);
      const float delta = (qh & 0x8000) ? -kIq1Delta : kIq1Delta;
      for (int l = 0; l < 4; ++l) {
        const uint16_t idx = uint16_t(x[b].qs[4 * ib + l] | (((qh >> (3 * l)) & 7) << 8));
        emit8(dl, delta, idx, y + b * kQK_K + 32 * ib + 8 * l);
      }
    }
  }
}

void dequantize_row_iq1_m(const BlockIq1M* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    uint16_t sc[4];
    std::memcpy(sc, x[b].scales, sizeof(sc));
    // The f16 super-scale is the top nibble of each of the four scale words.
    const uint16_t d_bits = uint16_t((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) |
                                     ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000));
    const float d = f16_to_f32(d_bits);
    for (int ib = 0; ib < 8; ++ib) {
      // Two 3-bit sub-scales per 32 elements: word ib/2 at shifts 6*(ib%2) and +3.
      const int shift = 6 * (ib % 2);
      const float dl[2] = {d * float(2 * ((sc[ib / 2] >> shift) & 7) + 1),
                           d * float(2 * ((sc[ib / 2] >> (shift + 3)) & 7) + 1)};
      for (int l = 0; l < 4; ++l) {
        // qh byte per 16 elements: low nibble for group 2k, high for 2k+1; each nibble is
        // 3 high index bits and the delta sign (bit 3).
        const uint8_t nib = uint8_t((x[b].qh[2 * ib + l / 2] >> (4 * (l % 2))) & 0x0f);
        const uint16_t idx = uint16_t(x[b].qs[4 * ib + l] | ((nib & 7) << 8));
        const float delta = (nib & 8) ? -kIq1Delta : kIq1Delta;
        emit8(dl[l / 2], delta, idx, y + b * kQK_K + 32 * ib + 8 * l);
      }
    }
  }
}

}  // namespace aff::quant
