// IQ4_NL (32-blocks, f16 scale) and IQ4_XS (256-blocks, 6-bit sub-scales): 4-bit codes
// into a fixed non-linear table (denser near zero, where weights concentrate).
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "quant/formats.h"
#include "quant/ggml_grids.h"
#include "quant/scale_search.h"

namespace aff::quant {
namespace {

struct Iq4Levels {
  float v[16];
  Iq4Levels() {
    for (int i = 0; i < 16; ++i) v[i] = float(kValuesIq4nl[i]);
  }
};
const Iq4Levels kLevels;

// Codes of 32 elements at the given scale, packed ggml's way: byte j = element j (low
// nibble) and element j+16 (high nibble).
void pack_iq4_32(const float* x, float scale, uint8_t* qs) {
  const float inv = scale != 0.0f ? 1.0f / scale : 0.0f;
  uint8_t codes[32];
  for (int j = 0; j < 32; ++j) codes[j] = uint8_t(nearest_level(kLevels.v, 16, x[j] * inv));
  for (int j = 0; j < 16; ++j) qs[j] = uint8_t(codes[j] | (codes[j + 16] << 4));
}

}  // namespace

void dequantize_row_iq4_nl(const BlockIq4Nl* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float d = f16_to_f32(x[b].d);
    float* yb = y + b * kQK;
    for (int j = 0; j < 16; ++j) {
      yb[j] = d * float(kValuesIq4nl[x[b].qs[j] & 0x0f]);
      yb[j + 16] = d * float(kValuesIq4nl[x[b].qs[j] >> 4]);
    }
  }
}

void dequantize_row_iq4_xs(const BlockIq4Xs* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float d = f16_to_f32(x[b].d);
    float* yb = y + b * kQK_K;
    for (int ib = 0; ib < 8; ++ib) {
      // 6-bit scale: low nibble from scales_l[ib/2], 2 high bits from scales_h; stored +32.
      const int ls = ((x[b].scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0f) |
                     (((x[b].scales_h >> (2 * ib)) & 3) << 4);
      const float dl = d * float(ls - 32);
      const uint8_t* qs = x[b].qs + 16 * ib;
      for (int j = 0; j < 16; ++j) {
        yb[32 * ib + j] = dl * float(kValuesIq4nl[qs[j] & 0x0f]);
        yb[32 * ib + j + 16] = dl * float(kValuesIq4nl[qs[j] >> 4]);
      }
    }
  }
}

void quantize_row_iq4_nl(const float* x, BlockIq4Nl* y, int64_t n, const float* imp) {
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float* xb = x + b * kQK;
    const float scale = fit_scale_levels(xb, imp ? imp + b * kQK : nullptr, kQK, kLevels.v, 16);
    y[b].d = f32_to_f16(scale);
    pack_iq4_32(xb, f16_to_f32(y[b].d), y[b].qs);
  }
}

void quantize_row_iq4_xs(const float* x, BlockIq4Xs* y, int64_t n, const float* imp) {
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float* xb = x + b * kQK_K;
    const float* wb = imp ? imp + b * kQK_K : nullptr;
    float scales[8];
    float big = 0.0f;
    for (int ib = 0; ib < 8; ++ib) {
      scales[ib] = fit_scale_levels(xb + 32 * ib, wb ? wb + 32 * ib : nullptr, 32, kLevels.v, 16);
      if (std::fabs(scales[ib]) > std::fabs(big)) big = scales[ib];
    }
    std::memset(&y[b], 0, sizeof(BlockIq4Xs));
    // The largest sub-scale takes code -32, the long end of the signed 6-bit range.
    y[b].d = f32_to_f16(big / -32.0f);
    const float d = f16_to_f32(y[b].d);
    for (int ib = 0; ib < 8; ++ib) {
      const int code = d != 0.0f ? round_clamp(scales[ib] / d, -32, 31) : 0;
      const int stored = code + 32;
      y[b].scales_l[ib / 2] |= uint8_t((stored & 0x0f) << (4 * (ib % 2)));
      y[b].scales_h = uint16_t(y[b].scales_h | ((stored >> 4) << (2 * ib)));
      pack_iq4_32(xb + 32 * ib, d * float(code), y[b].qs + 16 * ib);
    }
  }
}

}  // namespace aff::quant
