// Small float32 vector helpers shared by the reference ops and the model math.
// Everything here is plain loops the compiler can vectorise; no state.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace aff::ref {

// Multiply-adds below which a loop stays on one thread: an OpenMP region costs
// tens of microseconds (far more on an oversubscribed machine), so only work
// worth about a millisecond is split.
constexpr int64_t kParallelMinWork = int64_t(1) << 20;

// Lets OpenMP size each parallel region to the cores the machine has free
// (dynamic adjustment), once per calling thread, unless the user set
// OMP_DYNAMIC. Without it, a busy machine (other jobs, parallel test runs)
// makes every fork-join wait for descheduled spinning threads: the token-by-
// token golden test ran 12x slower under load.
void adapt_threads_to_load();

// Sum_i a[i] * b[i]; a, b: [n].
inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// y[i] += alpha * x[i]; x, y: [n].
inline void axpy(float alpha, const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// Element i of a 1-D (or flattened) tensor of a float dtype (F32/BF16/F16) as float.
// Small tensors only (norm weights, biases): the big weights go through linear().
float tensor_f32_at(const TensorView& t, int64_t i);

// A whole float-dtype tensor (F32/BF16/F16) converted to f32: [numel]. Used for
// vectors of at most a few thousand elements, converted when needed.
std::vector<float> tensor_to_f32(const TensorView& t);

// Element i of an integer tensor (I32/I64) as int64 (tid2eid).
int64_t tensor_i64_at(const TensorView& t, int64_t i);

}  // namespace aff::ref
