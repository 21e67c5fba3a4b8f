#include "backend/ref/vec.h"

#include <omp.h>

#include <cstdlib>

#include "core/check.h"
#include "core/dtype.h"

namespace aff::ref {

void adapt_threads_to_load() {
  thread_local bool done = false;
  if (done) return;
  done = true;
  if (std::getenv("OMP_DYNAMIC") == nullptr) omp_set_dynamic(1);
}

float tensor_f32_at(const TensorView& t, int64_t i) {
  switch (t.dtype) {
    case DType::kF32: return t.as<float>()[i];
    case DType::kBF16: return bf16_to_f32(t.as<uint16_t>()[i]);
    case DType::kF16: return f16_to_f32(t.as<uint16_t>()[i]);
    default: break;
  }
  AFF_CHECK(!"tensor_f32_at: not a float tensor");
  return 0.0f;
}

std::vector<float> tensor_to_f32(const TensorView& t) {
  const int64_t n = t.numel();
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = tensor_f32_at(t, i);
  return out;
}

int64_t tensor_i64_at(const TensorView& t, int64_t i) {
  switch (t.dtype) {
    case DType::kI64: return t.as<int64_t>()[i];
    case DType::kI32: return t.as<int32_t>()[i];
    default: break;
  }
  AFF_CHECK(!"tensor_i64_at: not an integer tensor");
  return 0;
}

}  // namespace aff::ref
