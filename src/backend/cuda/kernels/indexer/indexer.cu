// indexer_scores_f32_sm90: grid (key tiles of 8, T); one warp per key, heads in
// order (the reference's summation order over heads).
// indexer_topk_f32_sm90: one block of 256 threads per query: four 8-bit radix
// passes find the k-th largest key, then ids are compacted in id order.
#include <cfloat>

#include "backend/cuda/kernels/common/decode.cuh"
#include "backend/cuda/kernels/indexer/indexer.h"
#include "backend/cuda/runtime/cuda_check.h"

namespace aff::cuda {
namespace {

constexpr int kKeysPerBlock = 8;
constexpr int kTopkThreads = 256;

__device__ __forceinline__ int64_t visible(int64_t pos, int ratio, int64_t n_entries) {
  const int64_t v = (pos + 1) / ratio;
  return v < n_entries ? v : n_entries;
}

__global__ void __launch_bounds__(kKeysPerBlock * 32) indexer_scores_f32_sm90(IndexerScoreArgs a) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t j = int64_t(blockIdx.x) * kKeysPerBlock + warp;
  const int64_t t = blockIdx.y;
  if (j >= a.n_entries) return;
  float* out = a.scores + t * a.n_entries + j;
  if (j >= visible(a.pos0 + t, a.ratio, a.n_entries)) {
    if (lane == 0) *out = -INFINITY;
    return;
  }
  const float* k = a.keys + j * a.hd;
  float s = 0.0f;
  for (int h = 0; h < a.nh; ++h) {
    const float* q = a.q + (t * a.nh + h) * a.hd;
    float d = 0.0f;
    for (int i = lane; i < a.hd; i += 32) d = fmaf(q[i], k[i], d);
    d = warp_sum(d);
    s += fmaxf(d, 0.0f) * (a.w[t * a.nh + h] * a.w_scale);
  }
  if (lane == 0) *out = s;
}

// Order-preserving map of floats onto unsigned integers.
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f + 0.0f);  // -0 -> +0: equal scores must get equal keys
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Exclusive prefix sum of v over the block (kTopkThreads threads) and the total.
__device__ __forceinline__ int block_exclusive_scan(int v, int* warp_tot, int& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) warp_tot[warp] = x;
  __syncthreads();
  int before = 0;
  total = 0;
#pragma unroll
  for (int w = 0; w < kTopkThreads / 32; ++w) {
    if (w < warp) before += warp_tot[w];
    total += warp_tot[w];
  }
  __syncthreads();  // warp_tot is reused by the next call
  return before + x - v;
}

__global__ void __launch_bounds__(kTopkThreads) indexer_topk_f32_sm90(TopkArgs a) {
  __shared__ uint32_t hist[256];
  __shared__ uint32_t s_prefix, s_remaining;
  __shared__ int warp_tot[kTopkThreads / 32];
  const int64_t t = blockIdx.x;
  const int64_t n = visible(a.pos0 + t, a.ratio, a.n_entries);
  const float* sc = a.scores + t * a.ld;
  int32_t* out = a.sel + t * a.k;
  if (n <= a.k) {
    for (int64_t j = threadIdx.x; j < n; j += kTopkThreads) out[j] = int32_t(j);
    if (threadIdx.x == 0) a.count[t] = int32_t(n);
    return;
  }
  uint32_t prefix = 0, mask = 0, remaining = uint32_t(a.k);
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += kTopkThreads) hist[i] = 0;
    __syncthreads();
    for (int64_t j = threadIdx.x; j < n; j += kTopkThreads) {
      const uint32_t u = order_key(sc[j]);
      if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      uint32_t cum = 0;
      for (int b = 255; b >= 0; --b) {
        if (cum + hist[b] >= remaining) {
          s_prefix = prefix | (uint32_t(b) << shift);
          s_remaining = remaining - cum;
          break;
        }
        cum += hist[b];
      }
    }
    __syncthreads();
    prefix = s_prefix;
    remaining = s_remaining;
    mask |= 255u << shift;
    __syncthreads();
  }
  // prefix is now the exact key of the k-th largest score: take every larger
  // key and the `remaining` lowest-id keys equal to it.
  int out_base = 0, eq_seen = 0;
  for (int64_t j0 = 0; j0 < n; j0 += kTopkThreads) {
    const int64_t j = j0 + threadIdx.x;
    const uint32_t u = j < n ? order_key(sc[j]) : 0u;
    const bool gt = j < n && u > prefix;
    const bool eq = j < n && u == prefix;
    int eq_total = 0;
    const int eq_rank = eq_seen + block_exclusive_scan(eq ? 1 : 0, warp_tot, eq_total);
    const bool take = gt || (eq && uint32_t(eq_rank) < remaining);
    int take_total = 0;
    const int slot = out_base + block_exclusive_scan(take ? 1 : 0, warp_tot, take_total);
    if (take) out[slot] = int32_t(j);
    out_base += take_total;
    eq_seen += eq_total;
  }
  if (threadIdx.x == 0) a.count[t] = a.k;
}

}  // namespace

Status indexer_scores(const IndexerScoreArgs& a, cudaStream_t stream) {
  if (a.T == 0 || a.n_entries == 0) return Status::ok();
  if (a.T > 65535) return internal_error("indexer_scores: too many queries in one launch");
  const dim3 grid(unsigned((a.n_entries + kKeysPerBlock - 1) / kKeysPerBlock), unsigned(a.T));
  indexer_scores_f32_sm90<<<grid, kKeysPerBlock * 32, 0, stream>>>(a);
  return launch_status("indexer_scores_f32_sm90");
}

Status indexer_topk(const TopkArgs& a, cudaStream_t stream) {
  if (a.T == 0) return Status::ok();
  indexer_topk_f32_sm90<<<unsigned(a.T), kTopkThreads, 0, stream>>>(a);
  return launch_status("indexer_topk_f32_sm90");
}

}  // namespace aff::cuda
