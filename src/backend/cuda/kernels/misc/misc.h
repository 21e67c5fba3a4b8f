// Small kernels around the model: the embedding gather and the greedy argmax.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "affinity/status.h"
#include "backend/cuda/runtime/device_weights.h"

namespace aff::cuda {

// h[t, j, :] = table[tokens[t], :] for every stream j < hc.
//   table: [vocab, D] stored as `format` (kF32, kBF16 or kF16); tokens: [T] device;
//   h: [T, hc, D] f32.
Status embed_rows(const uint8_t* table, DevFormat format, const int32_t* tokens, int64_t T, int64_t D,
                  int hc, float* h, cudaStream_t stream);

// out[r] = the index of the largest of x[r, 0..n) (lowest index on ties). x: [rows, n].
Status argmax_rows(const float* x, int64_t rows, int64_t n, int32_t* out, cudaStream_t stream);

}  // namespace aff::cuda
