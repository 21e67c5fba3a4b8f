// Scalar activations and a row softmax, float32.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace aff::ref {

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

// log(1 + e^x) with PyTorch's default threshold: identity above 20.
inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// In-place softmax over x: [n]. Entries of -inf get weight 0; n >= 1 and at
// least one finite entry.
inline void softmax(float* x, int64_t n) {
  float m = x[0];
  for (int64_t i = 1; i < n; ++i) m = std::max(m, x[i]);
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    s += x[i];
  }
  const float inv = 1.0f / s;
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace aff::ref
