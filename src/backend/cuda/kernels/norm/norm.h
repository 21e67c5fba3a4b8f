// RMS normalisation, f32: y = weight * x * rsqrt(mean(x^2) + eps) per row.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "affinity/status.h"

namespace aff::cuda {

// x, y: [rows, n] row-major (y may alias x); weight: [n] f32 or null (unweighted).
Status rmsnorm_f32(const float* x, float* y, int64_t rows, int64_t n, const float* weight, float eps,
                   cudaStream_t stream);

}  // namespace aff::cuda
