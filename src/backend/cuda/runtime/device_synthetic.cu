// Device-side fills for the synthetic model: a counter-based hash (splitmix64
// finaliser of seed ^ index), so any byte's value depends only on (seed,
// index), the fill is embarrassingly parallel and ~100 GB take well under a
// second at HBM write speed.
#include "backend/cuda/runtime/device_synthetic.h"

#include <cuda_bf16.h>

#include "backend/cuda/runtime/cuda_check.h"

namespace aff::cuda {
namespace {

constexpr int kThreads = 256;
// Grid-stride loops: enough blocks to fill the GPU, never one per element of 100 GB.
constexpr int64_t kMaxBlocks = 132 * 16;

__device__ __forceinline__ uint64_t mix64(uint64_t x) {
  x ^= x >> 30, x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27, x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__device__ __forceinline__ float unit_float(uint64_t h) {  // uniform in [-1, 1)
  return float(int32_t(uint32_t(h >> 32))) * (1.0f / 2147483648.0f);
}

unsigned grid_for(size_t work) {
  const size_t blocks = (work + kThreads - 1) / kThreads;
  return unsigned(blocks < size_t(kMaxBlocks) ? (blocks ? blocks : 1) : size_t(kMaxBlocks));
}

// Bytes in 8-byte words; the tail (n % 8) by the first thread.
__global__ void synth_bytes_kernel(uint8_t* p, size_t n, uint64_t seed, uint8_t and_mask, uint8_t or_mask) {
  const uint64_t am = 0x0101010101010101ull * and_mask, om = 0x0101010101010101ull * or_mask;
  const size_t words = n / 8;
  const bool aligned = (reinterpret_cast<uintptr_t>(p) & 7) == 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < words; i += size_t(gridDim.x) * blockDim.x) {
    const uint64_t v = (mix64(seed ^ (i * 0x9E3779B97F4A7C15ull)) & am) | om;
    if (aligned) {
      reinterpret_cast<uint64_t*>(p)[i] = v;
    } else {
      for (int b = 0; b < 8; ++b) p[i * 8 + b] = uint8_t(v >> (8 * b));
    }
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    const uint64_t v = (mix64(seed ^ (words * 0x9E3779B97F4A7C15ull)) & am) | om;
    for (size_t b = words * 8; b < n; ++b) p[b] = uint8_t(v >> (8 * (b % 8)));
  }
}

__global__ void synth_f32_kernel(float* p, size_t n, uint64_t seed, float amp, float offset) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = offset + amp * unit_float(mix64(seed ^ (i * 0x9E3779B97F4A7C15ull)));
}

__global__ void synth_bf16_kernel(uint16_t* p, size_t n, uint64_t seed, float amp) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const __nv_bfloat16 v = __float2bfloat16(amp * unit_float(mix64(seed ^ (i * 0x9E3779B97F4A7C15ull))));
    p[i] = *reinterpret_cast<const uint16_t*>(&v);
  }
}

// Byte stores: ggml blocks are not 2-byte aligned in general (Q3_K is 110 bytes).
__global__ void synth_patch_u16_kernel(uint8_t* p, size_t n_blocks, size_t block_bytes, size_t offset,
                                       uint16_t bits) {
  for (size_t b = blockIdx.x * size_t(blockDim.x) + threadIdx.x; b < n_blocks; b += size_t(gridDim.x) * blockDim.x) {
    uint8_t* q = p + b * block_bytes + offset;
    q[0] = uint8_t(bits & 0xff), q[1] = uint8_t(bits >> 8);
  }
}

// Row r: k consecutive ids (mod E) from a hashed start, distinct for k <= E.
__global__ void synth_tid2eid_kernel(int32_t* p, int64_t vocab, int k, int E, uint64_t seed) {
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < vocab; r += int64_t(gridDim.x) * blockDim.x) {
    const int start = int(mix64(seed ^ uint64_t(r)) % uint64_t(E));
    for (int j = 0; j < k; ++j) p[r * k + j] = (start + j) % E;
  }
}

}  // namespace

Status synth_fill_bytes(uint8_t* p, size_t n, uint64_t seed, uint8_t and_mask, uint8_t or_mask, cudaStream_t s) {
  if (n == 0) return Status::ok();
  synth_bytes_kernel<<<grid_for(n / 8 + 1), kThreads, 0, s>>>(p, n, seed, and_mask, or_mask);
  return launch_status("synth_bytes_kernel");
}

Status synth_fill_f32(float* p, size_t n, uint64_t seed, float amp, float offset, cudaStream_t s) {
  if (n == 0) return Status::ok();
  synth_f32_kernel<<<grid_for(n), kThreads, 0, s>>>(p, n, seed, amp, offset);
  return launch_status("synth_f32_kernel");
}

Status synth_fill_bf16(uint16_t* p, size_t n, uint64_t seed, float amp, cudaStream_t s) {
  if (n == 0) return Status::ok();
  synth_bf16_kernel<<<grid_for(n), kThreads, 0, s>>>(p, n, seed, amp);
  return launch_status("synth_bf16_kernel");
}

Status synth_patch_u16(uint8_t* p, size_t n_blocks, size_t block_bytes, size_t offset, uint16_t bits,
                       cudaStream_t s) {
  if (n_blocks == 0) return Status::ok();
  synth_patch_u16_kernel<<<grid_for(n_blocks), kThreads, 0, s>>>(p, n_blocks, block_bytes, offset, bits);
  return launch_status("synth_patch_u16_kernel");
}

Status synth_fill_tid2eid(int32_t* p, int64_t vocab, int k, int E, uint64_t seed, cudaStream_t s) {
  if (vocab == 0 || k == 0) return Status::ok();
  if (k > E) return invalid_argument("synthetic tid2eid: more experts per token than experts");
  synth_tid2eid_kernel<<<grid_for(size_t(vocab)), kThreads, 0, s>>>(p, vocab, k, E, seed);
  return launch_status("synth_tid2eid_kernel");
}

}  // namespace aff::cuda
