#include "backend/ref/norm.h"

#include <cmath>

#include "backend/ref/vec.h"

namespace aff::ref {

void rmsnorm(float* x, int64_t rows, int64_t n, const float* weight, float eps) {
#pragma omp parallel for schedule(static) if (rows * n >= kParallelMinWork)
  for (int64_t r = 0; r < rows; ++r) {
    float* v = x + r * n;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < n; ++i) ss += v[i] * v[i];
    const float inv = 1.0f / std::sqrt(ss / float(n) + eps);
    if (weight) {
      for (int64_t i = 0; i < n; ++i) v[i] = weight[i] * (v[i] * inv);
    } else {
      for (int64_t i = 0; i < n; ++i) v[i] = v[i] * inv;
    }
  }
}

}  // namespace aff::ref
