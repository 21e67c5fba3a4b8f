// Dense weight times f32 activations for every stored format (FP8 block-scaled,
// MXFP4, BF16, F16, F32), dequantised on the fly with f32 accumulation. Serves
// decode (T = 1) and, for now, prefill (T tokens in tiles of kTokTile sharing
// each weight read); tensor-core GEMM for prefill comes later behind the same
// selection function.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "affinity/status.h"
#include "backend/cuda/runtime/device_weights.h"

namespace aff::cuda {

// y rows [row_begin, row_end) of W x for T activation rows:
//   x: T rows of w.in f32, row t at x + t*ldx (device);
//   y: T rows of (row_end - row_begin) f32, row t at y + t*ldy (device).
Status gemv_rows_f32(const DeviceLinear& w, int64_t row_begin, int64_t row_end, const float* x,
                     int64_t ldx, int64_t T, float* y, int64_t ldy, cudaStream_t stream);

// Raises every GEMV kernel's dynamic shared-memory limit. Launches do it on
// first use too; call this before capturing a graph (upload_model does).
Status gemv_prepare();

// Tuning knob for aff-bench-gemv: whether ggml rows stream through the per-warp
// shared-memory ring (cp.async) or are read directly. Not for use mid-capture.
void gemv_set_ggml_ring(bool on);
// Tuning knob for aff-bench-gemv: checkpoint-format rows read x from a permuted
// shared-memory copy (warp-contiguous float4 loads) instead of through L1.
// Off by default until measured on the GPU; results are bit-identical.
void gemv_set_native_perm(bool on);

// Decode (T = 1) FP8-block GEMV on f16 packed FMAs (gemv_fp8_h2.cu): the fast
// precision setting's path, ~1e-3 relative (x rounded to f16 after scaling by
// 1/max|x|, f16 sums of 8 products). Rows [row_begin, row_end); row r reads x
// slice k = r / rows_per_group - row_begin / rows_per_group at x + k * x_group_stride,
// so the attention's grouped output projection is one launch. y: [row_end - row_begin].
bool gemv_fp8_h2_supports(const DeviceLinear& w);
Status gemv_fp8_h2(const DeviceLinear& w, int64_t row_begin, int64_t row_end, const float* x, int64_t rows_per_group,
                   int64_t x_group_stride, float* y, cudaStream_t stream);

// y: [T, w.out] = x: [T, w.in] times W^T (all rows, packed).
inline Status gemv_f32(const DeviceLinear& w, const float* x, int64_t T, float* y, cudaStream_t stream) {
  return gemv_rows_f32(w, 0, w.out, x, w.in, T, y, w.out, stream);
}

}  // namespace aff::cuda
