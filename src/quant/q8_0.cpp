// Q8_0: 32 int8 quants with one f16 scale.
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "quant/formats.h"

namespace aff::quant {

void dequantize_row_q8_0(const BlockQ8_0* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float d = f16_to_f32(x[b].d);
    for (int j = 0; j < kQK; ++j) y[b * kQK + j] = float(x[b].qs[j]) * d;
  }
}

// Scale so the largest magnitude maps to ±127, round half away from zero: the same
// numbers ggml's reference quantiser produces, so files match byte for byte. Q8_0's
// error is far below any importance effect, so the importance vector is not used.
void quantize_row_q8_0(const float* x, BlockQ8_0* y, int64_t n, const float* /*imp*/) {
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float* xb = x + b * kQK;
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::fmax(amax, std::fabs(xb[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = f32_to_f16(d);
    for (int j = 0; j < kQK; ++j) y[b].qs[j] = int8_t(std::round(xb[j] * id));
  }
}

}  // namespace aff::quant
