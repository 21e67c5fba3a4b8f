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

// Asks L2 for up to kL2Ranges byte ranges (a hint through the bulk-copy
// engine, common/l2_prefetch.cuh; nothing completes and nothing changes). A
// decode step runs it on its own stream ahead of the kernels that read the
// ranges, while latency-bound kernels leave HBM idle.
constexpr int kL2Ranges = 8;
struct L2Ranges {
  const void* p[kL2Ranges] = {};
  int64_t bytes[kL2Ranges] = {};
  int n = 0;
  void add(const void* ptr, int64_t b) {
    if (ptr != nullptr && b > 0 && n < kL2Ranges) p[n] = ptr, bytes[n] = b, ++n;
  }
};
Status l2_prefetch_ranges(const L2Ranges& r, cudaStream_t stream);

// The weight-streaming floor for benchmarks: reads bytes [0, n) at p (16-byte
// aligned, n a multiple of 16) with the GEMVs' streaming load and folds them
// into sink[0] (so the reads cannot be dropped). What a kernel of that size can
// reach when it does nothing else.
Status hbm_read_probe(const uint8_t* p, int64_t n, uint32_t* sink, cudaStream_t stream);

// out[r] = the index of the largest of x[r, 0..n) (lowest index on ties). x: [rows, n].
Status argmax_rows(const float* x, int64_t rows, int64_t n, int32_t* out, cudaStream_t stream);

}  // namespace aff::cuda
