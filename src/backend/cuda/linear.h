// The dense linear of the forward pass: y = x W^T for T activation rows,
// routed by T between the GEMV (weight-bandwidth bound, decode and short
// chunks) and the tensor-core GEMM (compute bound, prefill). The crossover is
// measured on the H200 (docs/BENCHMARKS.md) and kept in kGemmMinTokens.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "affinity/status.h"
#include "backend/cuda/runtime/device_weights.h"

namespace aff::cuda {

// Fewest tokens for which the GEMM beats the GEMV.
constexpr int64_t kGemmMinTokens = 64;

// Which engine serves (w, T): true = tensor-core GEMM.
bool linear_uses_gemm(const DeviceLinear& w, int64_t T);

// y rows [row_begin, row_end) of W x: x is T rows of w.in f32 at stride ldx,
// y is T rows of (row_end - row_begin) f32 at stride ldy (device pointers).
Status linear_rows(const DeviceLinear& w, int64_t row_begin, int64_t row_end, const float* x, int64_t ldx,
                   int64_t T, float* y, int64_t ldy, cudaStream_t stream);

// Grouped rows: group g's rows [g*R, (g+1)*R) of W read x's columns
// [g*w.in, (g+1)*w.in): x: [T, G*w.in] at stride ldx, y: [T, G*R] at stride
// ldy, w.out = G*R. The GEMM path runs all groups as one batched multiply.
Status linear_grouped(const DeviceLinear& w, int G, int64_t R, const float* x, int64_t ldx, int64_t T, float* y,
                      int64_t ldy, cudaStream_t stream);

// y: [T, w.out] = x: [T, w.in] times W^T.
inline Status linear(const DeviceLinear& w, const float* x, int64_t T, float* y, cudaStream_t stream) {
  return linear_rows(w, 0, w.out, x, w.in, T, y, w.out, stream);
}

}  // namespace aff::cuda
