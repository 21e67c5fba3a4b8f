// MXFP4 in ggml's packing: 32 E2M1 codes with one E8M0 exponent.
#include <cmath>

#include "core/dtype.h"
#include "quant/formats.h"
#include "quant/ggml_grids.h"

namespace aff::quant {
namespace {

// ggml's "half" E8M0 decode: 2^(e-128), so that the doubled E2M1 table gives 2^(e-127)·v.
// e = 0 and 1 land in the f32 denormal range.
float e8m0_to_f32_half(uint8_t e) {
  const uint32_t bits = e < 2 ? (0x00200000u << e) : (uint32_t(e - 1) << 23);
  return f32_from_bits(bits);
}

}  // namespace

void dequantize_row_mxfp4(const BlockMxfp4* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float d = e8m0_to_f32_half(x[b].e);
    float* yb = y + b * kQK;
    for (int j = 0; j < kQK / 2; ++j) {
      yb[j] = float(kValuesMxfp4[x[b].qs[j] & 0x0f]) * d;
      yb[j + kQK / 2] = float(kValuesMxfp4[x[b].qs[j] >> 4]) * d;
    }
  }
}

// The exponent puts the block's largest magnitude in the table's top octave
// (floor(log2 amax) - 2 relative to the doubled table's max of 12 ≈ 2^3.6), then each
// value takes the nearest table entry, first index on ties. This is the gguf package's
// (and ggml's) choice, kept so that our MXFP4 output is byte-identical to theirs. With a
// single shared exponent there is nothing for an importance vector to trade off.
void quantize_row_mxfp4(const float* x, BlockMxfp4* y, int64_t n, const float* /*imp*/) {
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float* xb = x + b * kQK;
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::fmax(amax, std::fabs(xb[j]));
    int e = 0;
    if (amax > 0.0f) e = int(std::floor(std::log2(amax))) - 2 + 127;
    e = e < 0 ? 0 : (e > 254 ? 254 : e);
    y[b].e = uint8_t(e);
    const float d = e8m0_to_f32_half(uint8_t(e));
    uint8_t codes[kQK];
    for (int j = 0; j < kQK; ++j) {
      int best = 0;
      float best_err = std::fabs(d * float(kValuesMxfp4[0]) - xb[j]);
      for (int k = 1; k < 16; ++k) {
        const float err = std::fabs(d * float(kValuesMxfp4[k]) - xb[j]);
        if (err < best_err) best_err = err, best = k;
      }
      codes[j] = uint8_t(best);
    }
    for (int j = 0; j < kQK / 2; ++j) y[b].qs[j] = uint8_t(codes[j] | (codes[j + kQK / 2] << 4));
  }
}

}  // namespace aff::quant
