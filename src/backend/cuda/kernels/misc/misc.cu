// embed_f32_sm90: one thread per (token, channel). argmax_f32_sm90: one block
// of 1024 threads per row, float4 loads, several in flight per thread (a
// vocabulary row is ~0.5 MB: one load at a time per thread took ~30 us).
#include <cuda_fp16.h>

#include <cfloat>

#include "backend/cuda/kernels/common/decode.cuh"
#include "backend/cuda/kernels/common/l2_prefetch.cuh"
#include "backend/cuda/kernels/misc/misc.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/device_info.h"
#include "backend/cuda/runtime/pdl.h"

namespace aff::cuda {
namespace {

__global__ void embed_f32_sm90(const uint8_t* table, DevFormat format, const int32_t* tokens, int64_t T,
                               int64_t D, int hc, float* h) {
  pdl_start();  // runtime/pdl.h: nothing in this kernel runs before the wait
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= T * D) return;
  const int64_t t = i / D, d = i % D;
  const int64_t src = int64_t(tokens[t]) * D + d;
  float v;
  if (format == DevFormat::kF32) v = reinterpret_cast<const float*>(table)[src];
  else if (format == DevFormat::kBF16) v = bf16_bits_to_f32(reinterpret_cast<const uint16_t*>(table)[src]);
  else v = f16_bits_to_f32(reinterpret_cast<const uint16_t*>(table)[src]);
  for (int j = 0; j < hc; ++j) h[(t * hc + j) * D + d] = v;
}

// Thread i of the grid takes the 64 KB pieces i, i + threads, ... of the ranges.
constexpr int kPrefetchBlocks = 8;
constexpr int64_t kPrefetchPiece = 64 * 1024;
__global__ void l2_prefetch_sm90(L2Ranges r) {
  const int64_t nt = int64_t(gridDim.x) * blockDim.x, i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t first = 0;  // global index of range j's first piece
  for (int j = 0; j < r.n; ++j) {
    const int64_t pieces = (r.bytes[j] + kPrefetchPiece - 1) / kPrefetchPiece;
    for (int64_t q = ((i - first) % nt + nt) % nt; q < pieces; q += nt) {
      const int64_t off = q * kPrefetchPiece;
      l2_prefetch(static_cast<const uint8_t*>(r.p[j]) + off, min(kPrefetchPiece, r.bytes[j] - off));
    }
    first += pieces;
  }
}

// Four 16-byte loads in flight per thread, grid-strided; 8 blocks of 256
// threads per SM keep ~128 KB per SM requested.
constexpr int kProbeThreads = 256;
__global__ void __launch_bounds__(kProbeThreads) hbm_read_probe_sm90(const uint4* p, int64_t n16, uint32_t* sink) {
  const int64_t nt = int64_t(gridDim.x) * blockDim.x;
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  uint32_t acc = 0;
  for (; i + 3 * nt < n16; i += 4 * nt) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = ld_stream16(reinterpret_cast<const uint8_t*>(p + i + u * nt));
#pragma unroll
    for (int u = 0; u < 4; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n16; i += nt) {
    const uint4 v = ld_stream16(reinterpret_cast<const uint8_t*>(p + i));
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) atomicXor(sink, acc);  // almost never taken; keeps the loads
}

constexpr int kArgmaxThreads = 1024;

__device__ __forceinline__ void keep_max(float v, int32_t i, float& best, int32_t& best_i) {
  if (v > best || (v == best && i < best_i)) best = v, best_i = i;
}

__global__ void __launch_bounds__(kArgmaxThreads) argmax_f32_sm90(const float* x, int64_t n, int32_t* out) {
  pdl_start();  // runtime/pdl.h: nothing in this kernel runs before the wait
  __shared__ float sv[kArgmaxThreads / 32];
  __shared__ int32_t si[kArgmaxThreads / 32];
  const float* row = x + int64_t(blockIdx.x) * n;
  float best = -INFINITY;
  int32_t best_i = 0x7fffffff;
  const bool vec = n % 4 == 0 && reinterpret_cast<uintptr_t>(row) % 16 == 0;
  if (vec) {
    const float4* r4 = reinterpret_cast<const float4*>(row);
    const int64_t n4 = n / 4;
    constexpr int kU = 4;
    for (int64_t i0 = threadIdx.x; i0 < n4; i0 += int64_t(kArgmaxThreads) * kU) {
      float4 v[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int64_t i = i0 + int64_t(u) * kArgmaxThreads;
        v[u] = i < n4 ? __ldcs(r4 + i) : make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int32_t i = int32_t(4 * (i0 + int64_t(u) * kArgmaxThreads));
        keep_max(v[u].x, i, best, best_i);
        keep_max(v[u].y, i + 1, best, best_i);
        keep_max(v[u].z, i + 2, best, best_i);
        keep_max(v[u].w, i + 3, best, best_i);
      }
    }
  } else {
    for (int64_t i = threadIdx.x; i < n; i += kArgmaxThreads) keep_max(row[i], int32_t(i), best, best_i);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, best_i, o);
    if (ov > best || (ov == best && oi < best_i)) best = ov, best_i = oi;
  }
  if ((threadIdx.x & 31) == 0) sv[threadIdx.x >> 5] = best, si[threadIdx.x >> 5] = best_i;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kArgmaxThreads / 32; ++w)
      if (sv[w] > best || (sv[w] == best && si[w] < best_i)) best = sv[w], best_i = si[w];
    out[blockIdx.x] = best_i == 0x7fffffff ? 0 : best_i;
  }
}

}  // namespace

Status embed_rows(const uint8_t* table, DevFormat format, const int32_t* tokens, int64_t T, int64_t D,
                  int hc, float* h, cudaStream_t stream) {
  if (format != DevFormat::kF32 && format != DevFormat::kBF16 && format != DevFormat::kF16)
    return unsupported("embedding: table format not supported on the GPU");
  if (T * D == 0) return Status::ok();
  const cudaError_t e = launch_pdl(embed_f32_sm90, dim3(unsigned((T * D + 255) / 256)), dim3(256), 0, stream, table, format, tokens, T, D, hc, h);
  return cuda_status(e, "embed_f32_sm90");
}

Status argmax_rows(const float* x, int64_t rows, int64_t n, int32_t* out, cudaStream_t stream) {
  if (rows == 0) return Status::ok();
  const cudaError_t e = launch_pdl(argmax_f32_sm90, dim3(unsigned(rows)), dim3(kArgmaxThreads), 0, stream, x, n, out);
  return cuda_status(e, "argmax_f32_sm90");
}

Status hbm_read_probe(const uint8_t* p, int64_t n, uint32_t* sink, cudaStream_t stream) {
  if (n <= 0) return Status::ok();
  if (n % 16 != 0 || reinterpret_cast<uintptr_t>(p) % 16 != 0) return internal_error("hbm_read_probe: unaligned range");
  hbm_read_probe_sm90<<<current_device_multiprocessors() * 8, kProbeThreads, 0, stream>>>(reinterpret_cast<const uint4*>(p), n / 16, sink);
  return launch_status("hbm_read_probe_sm90");
}

Status l2_prefetch_ranges(const L2Ranges& r, cudaStream_t stream) {
  if (r.n == 0) return Status::ok();
  l2_prefetch_sm90<<<kPrefetchBlocks, 32, 0, stream>>>(r);
  return launch_status("l2_prefetch_sm90");
}

}  // namespace aff::cuda
