// Prefill linear on tensor cores: y[T, rows] = x[T, in] W[rows, in]^T for
// many tokens. W is decoded tile-by-tile (row blocks) from its stored format
// to bf16 (exact for FP8 E4M3 x E8M0, MXFP4 and BF16), x is rounded to bf16
// (hi + lo in kBf16x3, as two GEMMs), and cuBLAS multiplies with f32
// accumulation and f32 output.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "affinity/status.h"
#include "backend/cuda/kernels/gemm/mma_precision.h"
#include "backend/cuda/runtime/device_weights.h"

namespace aff::cuda {

// Whether gemm_rows_bf16 serves w at this precision (the rest stay on the
// GEMV): FP8 block, MXFP4 and BF16 decode to bf16 exactly; F32 and F16 do not,
// so they take the GEMM only when bf16 rounding is allowed (kBf16). ggml
// block formats take it in both settings, rounded to bf16: nothing is exact
// for them (their GEMV quantises x to int8 per 32). The grouped experts'
// fused ggml kernels go further and use x's bf16 hi part only, in both
// settings (moe_grouped.h).
bool gemm_supports(const DeviceLinear& w, MmaPrecision precision);

// dst: [n_rows, w.in] bf16 bits = rows [row_begin, row_begin + n_rows) of w.
Status dequant_rows_bf16(const DeviceLinear& w, int64_t row_begin, int64_t n_rows, uint16_t* dst,
                         cudaStream_t stream);

// hi (and lo when lo != null): [T, in] bf16 bits of x: T rows of `in` f32 at
// stride ldx, with hi + lo ~= x.
Status split_rows_bf16(const float* x, int64_t ldx, int64_t T, int64_t in, uint16_t* hi, uint16_t* lo,
                       cudaStream_t stream);

// While one lives, the prefill GEMMs on its stream whose activations are
// exactly its (x, ldx, T, in) round x to bf16 once instead of once per call:
// a layer's projections that read one input (wq_a, wkv, the compressors' and
// the indexer's; the router gate and the shared expert) share one split. x
// must not be written while it lives; one per stream at a time (a second
// replaces the first). Construction and destruction only record; nothing runs.
class GemmSharedInput {
 public:
  GemmSharedInput(const float* x, int64_t ldx, int64_t T, int64_t in, cudaStream_t stream);
  ~GemmSharedInput();
  GemmSharedInput(const GemmSharedInput&) = delete;
  GemmSharedInput& operator=(const GemmSharedInput&) = delete;

 private:
  cudaStream_t stream_;
};

// Same contract as gemv_rows_f32 (gemv/gemv.h): y rows [row_begin, row_end)
// of W x for T rows of x (stride ldx) into y (stride ldy). Scratch (decoded
// weight tiles, bf16 activations, the cuBLAS handle) belongs to the stream
// and grows on first use, so the first call at a new size allocates: never
// call it inside a captured graph.
Status gemm_rows_bf16(const DeviceLinear& w, int64_t row_begin, int64_t row_end, const float* x, int64_t ldx,
                      int64_t T, float* y, int64_t ldy, MmaPrecision precision, cudaStream_t stream);

// Grouped rows: for g in [0, G), y[:, g*R .. (g+1)*R) = x[:, g*group_in ..
// (g+1)*group_in) times rows [g*R, (g+1)*R) of W^T; W: [G*R, group_in], x:
// [T, G*group_in] at stride ldx, y: [T, G*R] at stride ldy. One split of x,
// one decode of W and one batched multiply (per hi/lo) instead of G of each.
Status gemm_grouped_rows_bf16(const DeviceLinear& w, int G, int64_t R, const float* x, int64_t ldx, int64_t T,
                              float* y, int64_t ldy, MmaPrecision precision, cudaStream_t stream);

}  // namespace aff::cuda
