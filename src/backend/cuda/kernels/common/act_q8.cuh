// Activations quantised to int8 in shared memory for the ggml-format dot
// products: per 32 consecutive elements one f32 scale (amax / 127) and 32
// codes, so a 32-element weight chunk meets its activations as eight int32
// words for dp4a. Relative error per element <= 1/254 of its group's amax
// (issue 5 allows activation quantisation; the tests bound the result).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace aff::cuda {

// One token's quantised activations in shared memory.
struct ActQ8View {
  const int8_t* q;   // [n] codes, 16-byte aligned
  const float* s;    // [n / 32] scales
};

// Shared memory per token: n codes then n/32 f32 scales, rounded up to 16 bytes
// so that every token's codes stay 16-byte aligned.
__host__ __device__ constexpr int64_t act_q8_stride(int64_t n) { return (n + n / 32 * 4 + 15) / 16 * 16; }
// Bytes for nt tokens of n elements (n a multiple of 32).
__host__ __device__ constexpr int64_t act_q8_bytes(int64_t nt, int64_t n) { return nt * act_q8_stride(n); }

// Block-cooperative: quantises tokens [0, nt) of x (row t at x + t*ldx, n f32
// each) into smem, token t at smem + t * act_q8_stride(n). One warp per
// 32-element group. The caller synchronises (__syncthreads) before reading.
__device__ __forceinline__ void act_q8_stage(const float* __restrict__ x, int64_t ldx, int nt, int64_t n,
                                             uint8_t* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  const int64_t groups = n / 32, stride = act_q8_stride(n);
  for (int64_t g = warp; g < nt * groups; g += n_warps) {
    const int64_t t = g / groups, c = g % groups;
    int8_t* q = reinterpret_cast<int8_t*>(smem + t * stride);
    float* s = reinterpret_cast<float*>(smem + t * stride + n);
    const float v = x[t * ldx + c * 32 + lane];
    float amax = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float scale = amax / 127.0f;
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    q[c * 32 + lane] = int8_t(__float2int_rn(v * inv));
    if (lane == 0) s[c] = scale;
  }
}

__device__ __forceinline__ ActQ8View act_q8_view(const uint8_t* smem, int64_t n, int t) {
  const uint8_t* p = smem + t * act_q8_stride(n);
  return {reinterpret_cast<const int8_t*>(p), reinterpret_cast<const float*>(p + n)};
}

}  // namespace aff::cuda
