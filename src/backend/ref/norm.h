// RMS normalisation, float32 throughout (no intermediate rounding).
#pragma once

#include <cstdint>

namespace aff::ref {

// In place over each of `rows` rows of n values:
//   x <- weight * x * rsqrt(mean(x^2) + eps).
//   x: [rows, n] row-major; weight: [n] f32, or nullptr for the unweighted norm
//   (the per-head q norm and the mHC input norm).
void rmsnorm(float* x, int64_t rows, int64_t n, const float* weight, float eps);

}  // namespace aff::ref
