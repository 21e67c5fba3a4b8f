// Dense weight times f32 activations for every stored format (FP8 block-scaled,
// MXFP4, BF16, F16, F32, ggml blocks, split Q8_0), dequantised on the fly with f32 accumulation. Serves
// decode (T = 1) and, for now, prefill (T tokens in tiles of kTokTile sharing
// each weight read); tensor-core GEMM for prefill comes later behind the same
// selection function.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "affinity/status.h"
#include "backend/cuda/kernels/mhc/mhc.h"
#include "backend/cuda/runtime/device_weights.h"
#include "backend/cuda/runtime/step_info.h"

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

// Decode-sized (any T, up to 8 per launch) GEMV on tensor cores for FP8-block,
// split Q8_0 (kQ8) and BF16 weights (gemv_mma.cu): f16 MMAs on hardware-
// converted E4M3 (or int8 codes placed in f16) with x as f16 hi + lo (exact
// setting, ~2^-22 relative) or hi alone (fast, ~2^-12);
// bf16 MMAs on the stored bits with x as bf16 hi + mid + lo (exact, ~2^-24) or
// hi + mid (fast, ~2^-16). Rows [row_begin, row_end); x: token t at x + t*ldx;
// y: token t at y + t*ldy, [row_end - row_begin] each. Row r reads x's slice
// k = r / rows_per_group - row_begin / rows_per_group at + k * x_group_stride,
// so the attention's grouped output projection is one launch (ungrouped:
// rows_per_group >= w.out rounded up to 16, stride 0). Needs w.in % 128 == 0,
// row_begin and rows_per_group multiples of 16.
bool gemv_mma_supports(const DeviceLinear& w, int64_t row_begin, int64_t rows_per_group);
Status gemv_mma(const DeviceLinear& w, int64_t row_begin, int64_t row_end, const float* x, int64_t ldx, int64_t T,
                float* y, int64_t ldy, int64_t rows_per_group, int64_t x_group_stride, cudaStream_t stream);
// y: [T, w.out] = rmsnorm(x) W^T with x: [T, w.in] packed, where row t of
// rmsnorm(x) is norm * x_t / sqrt(mean(x_t^2) + eps) (norm: [w.in]), as
// rmsnorm_f32 computes it: the norm folded into the projection's launch.
// max_blocks > 0 caps the grid (as PairOptions); programmatic = false: a plain
// launch, whose blocks do not take SMs before the previous kernel ends.
Status gemv_mma_normed(const DeviceLinear& w, const float* x, int64_t T, float* y, const float* norm, float eps,
                       cudaStream_t stream, int max_blocks = 0, bool programmatic = true);
// y: [T, w.out] = x W^T, x: [T, w.in] (token t at + t*ldx), y token t at +
// t*ldy: a plain projection for a side stream (an ordinary launch, the grid
// capped at max_blocks > 0), e.g. the shared expert's down projection.
Status gemv_mma_side(const DeviceLinear& w, const float* x, int64_t ldx, int64_t T, float* y, int64_t ldy,
                     int max_blocks, cudaStream_t stream);
// y: [T, w.out] = swiglu_clamp(gate, up, swiglu_limit) W^T, gate and up
// [T, w.in] (token t at + t*ldx): an expert's down projection with its SwiGLU
// done while x is staged. max_blocks > 0 caps the grid (as PairOptions).
// Launched as an ordinary (not programmatic) dependent.
Status gemv_mma_swiglu(const DeviceLinear& w, const float* gate, const float* up, int64_t ldx, int64_t T,
                       float swiglu_limit, float* y, int64_t ldy, int max_blocks, cudaStream_t stream);
// What a gemv_mma_pair launch may do besides its two projections:
//  - norm ([w1.in], optional): x's rows are rmsnorm'd with it first, as
//    gemv_mma_normed does (x then packed, ldx = w1.in);
//  - job: a deferred mHC comb finished in one extra block (mhc.h);
//  - step + complete_ratio > 0: the launch runs only in a decode step whose
//    position completes a block of complete_ratio positions ((pos0 + 1) %
//    ratio == 0, pos0 read from the device's StepInfo); otherwise every block
//    leaves at once (a compressor's projections, needed only then).
//  - max_blocks > 0: at most that many blocks (more row tiles per block), for
//    a launch beside the step's path that should leave most SMs to it.
struct PairOptions {
  const float* norm = nullptr;
  float eps = 0.0f;
  HcCombJob job;
  const StepInfo* step = nullptr;
  int complete_ratio = 0;
  int max_blocks = 0;
};

// Two projections of the same x in one launch (w1's rows, then w2's, as if
// stacked): y1 [T, w1.out] (token t at y1 + t*ldy1) = x W1^T and y2 [T, w2.out]
// = x W2^T, each with gemv_mma's arithmetic. Needs both supported, the same
// format, width and block scales, and w1.out % 16 == 0.
bool gemv_mma_pair_supports(const DeviceLinear& w1, const DeviceLinear& w2);
Status gemv_mma_pair(const DeviceLinear& w1, const DeviceLinear& w2, const float* x, int64_t ldx, int64_t T, float* y1,
                     int64_t ldy1, float* y2, int64_t ldy2, cudaStream_t stream, const PairOptions& o = {});
// Raises the kernels' shared-memory limit (part of gemv_prepare).
Status gemv_mma_prepare();
// Whether the forward pass sends w (rows from row_begin, groups of
// rows_per_group) to gemv_mma: whenever it is supported, except that BF16
// weights below 32 MB go there only with AFF_CUDA_BF16_MMA=1 (measured no
// faster than gemv_any on the decode path; the large ones, the heads, stream
// faster there).
bool gemv_mma_takes(const DeviceLinear& w, int64_t row_begin, int64_t rows_per_group);
// gemv_mma_takes for all of w's rows as one group (a plain projection, as
// gemv_mma_pair and gemv_mma_normed run it).
bool gemv_mma_takes_all(const DeviceLinear& w);

// y: [T, w.out] = x: [T, w.in] times W^T (all rows, packed).
inline Status gemv_f32(const DeviceLinear& w, const float* x, int64_t T, float* y, cudaStream_t stream) {
  return gemv_rows_f32(w, 0, w.out, x, w.in, T, y, w.out, stream);
}

}  // namespace aff::cuda
