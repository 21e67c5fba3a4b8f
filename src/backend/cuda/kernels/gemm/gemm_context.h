// Per-stream state of the prefill GEMM paths (gemm_cublas.cpp, moe_grouped.cpp):
// the cuBLAS handle, its workspace and scratch buffers that grow on first use.
// Internal to kernels/gemm.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <mutex>

#include "affinity/status.h"
#include "backend/cuda/runtime/device_buffer.h"

namespace aff::cuda {

enum GemmBuf : int {
  kBufWTile,    // bf16 decoded weight tile
  kBufXHi,      // bf16 activations (hi)
  kBufXLo,      // bf16 activations (lo, kBf16x3)
  kBufSort,     // i32 expert counts, offsets, slot <-> pair maps
  kBufGate,     // f32 [pairs, inter]
  kBufUp,       // f32 [pairs, inter]
  kBufActHi,    // bf16 [pairs, inter]
  kBufActLo,    // bf16 [pairs, inter]
  kBufY,        // f32 [pairs, D] expert outputs in sorted order
  kBufSharedHi, // bf16 split of the live GemmSharedInput (hi)
  kBufSharedLo, // bf16 split of the live GemmSharedInput (lo)
  kBufCount,
};

// The input declared by a live GemmSharedInput and whether its split is made.
struct SharedInputState {
  const float* x = nullptr;  // null: none declared
  int64_t ldx = 0, T = 0, in = 0;
  bool has_hi = false, has_lo = false;
};

struct GemmContext {
  cublasHandle_t handle = nullptr;
  DeviceBuffer workspace;
  std::array<DeviceBuffer, kBufCount> buf;
  SharedInputState shared;
  std::mutex mu;  // one call at a time per stream
};

// The context of `stream` (created on first use).
Result<GemmContext*> gemm_context(cudaStream_t stream);

// buf[which] with at least `bytes` (reallocated when smaller: synchronises).
Result<void*> gemm_scratch(GemmContext& ctx, GemmBuf which, size_t bytes);

// x: [T, in] f32 (row stride ldx) as bf16 for a GEMM: *hi (and *lo when
// want_lo), [T, in] with row stride in. From the live GemmSharedInput's split
// when x is its input (made on the first such call), else split into
// kBufXHi / kBufXLo. Call with ctx.mu held.
Status gemm_input_bf16(GemmContext& ctx, const float* x, int64_t ldx, int64_t T, int64_t in, bool want_lo,
                       const uint16_t** hi, const uint16_t** lo, cudaStream_t stream);

// y[T, n] (row stride ldy, f32) = x[T, K] (bf16, row stride ldx) W[n, K]^T (bf16, row stride K);
// with x_lo, adds x_lo W^T (beta = 1): the hi + lo split of kBf16x3.
Status gemm_bf16_f32(GemmContext& ctx, int64_t n, int64_t T, int64_t K, const uint16_t* w, const uint16_t* x_hi,
                     const uint16_t* x_lo, int64_t ldx, float* y, int64_t ldy);

}  // namespace aff::cuda
