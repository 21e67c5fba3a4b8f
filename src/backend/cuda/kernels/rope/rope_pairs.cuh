// The vectorised RoPE step the decode kernels share (qkv_finish's rows, the
// indexer's queries as the scores launch loads them): one (cos, sin) table
// per token, then two interleaved pairs of a float4 rotated at once. One home
// for the arithmetic, so the two places round alike.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace aff::cuda {

// tab[p] = (cos, sin) of f32(pos) * inv_freq[p] for p < half, filled by the
// calling block's threads tid, tid + nthreads, ... (the caller syncs after).
__device__ __forceinline__ void rope_table_fill(float2* tab, int64_t pos, const float* inv_freq, int half, int tid,
                                                int nthreads) {
  for (int p = tid; p < half; p += nthreads) {
    float s, c;
    sincosf(float(pos) * inv_freq[p], &s, &c);
    tab[p] = make_float2(c, s);
  }
}

// Pairs (n.x, n.y) and (n.z, n.w) rotated by cs = (c0, s0, c1, s1): two
// consecutive table entries read as one float4.
__device__ __forceinline__ float4 rope_rotate4(float4 n, float4 cs) {
  return make_float4(n.x * cs.x - n.y * cs.y, n.y * cs.x + n.x * cs.y, n.z * cs.z - n.w * cs.w,
                     n.w * cs.z + n.z * cs.w);
}

}  // namespace aff::cuda
