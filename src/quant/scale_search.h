// Weighted least-squares scale search shared by the reference quantisers.
// Every fit minimises sum_i w[i] * (x[i] - reconstruction[i])^2 over a short sub-block;
// w = nullptr means uniform weights.
#pragma once

#include <cstdint>

namespace aff::quant {

// Affine fit x ≈ scale * q - min with q in [0, nmax], scale >= 0, min >= 0 (the K-quant
// "scale and min" form). x, w: [len].
struct ScaleMin {
  float scale = 0.0f;
  float min = 0.0f;
};
ScaleMin fit_scale_min(const float* x, const float* w, int len, int nmax);

// Nearest level index of value v in an ascending table levels[n].
int nearest_level(const float* levels, int n, float v);

// Symmetric fit x ≈ scale * levels[q] over an ascending level table (uniform {-4..3} for
// Q3_K, the non-linear IQ4 table, ...). The scale may be negative, which mirrors the table
// so that the block's largest magnitude can use its longer side. x, w: [len].
float fit_scale_levels(const float* x, const float* w, int len, const float* levels, int n_levels);

// Weighted squared error of x against scale * levels[nearest].
float levels_error(const float* x, const float* w, int len, const float* levels, int n_levels,
                   float scale);

// Rounds to the nearest integer, halves away from zero, clamped to [lo, hi].
inline int round_clamp(float v, int lo, int hi) {
  const float r = v < 0.0f ? -static_cast<float>(static_cast<int64_t>(-v + 0.5f))
                           : static_cast<float>(static_cast<int64_t>(v + 0.5f));
  if (!(r >= float(lo))) return lo;  // also catches NaN
  if (r > float(hi)) return hi;
  return int(r);
}

}  // namespace aff::quant
