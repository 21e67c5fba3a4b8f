// attention_sparse_f32_sm90: one block of 128 threads per (head, query). Keys
// are visited in tiles of 32 (a warp scores 8 of them), with an online softmax
// whose running max starts at the sink logit; each thread owns Dh/128 output
// channels. Same math as the reference, different summation order.
#include <cfloat>

#include "backend/cuda/kernels/attention/attention.h"
#include "backend/cuda/kernels/common/decode.cuh"
#include "backend/cuda/runtime/cuda_check.h"

namespace aff::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kTile = 32;
constexpr int kMaxDh = 512;
constexpr int kPerThread = kMaxDh / kThreads;

struct KeyRange {
  int64_t pos, win_start, n_win, n_keys;
};

__device__ __forceinline__ const float* key_ptr(const AttentionArgs& a, int64_t t, const KeyRange& r, int64_t i) {
  if (i < r.n_win) {
    const int64_t p = r.win_start + i;
    return p >= a.pos0 ? a.kv + (p - a.pos0) * a.Dh : a.ring + (p % a.W) * a.Dh;
  }
  int64_t j = i - r.n_win;
  if (a.mode == AttnEntries::kSelected) j = a.sel[t * a.sel_ld + j];
  return a.entries + j * a.Dh;
}

__global__ void __launch_bounds__(kThreads) attention_sparse_f32_sm90(AttentionArgs a) {
  extern __shared__ float q_s[];  // [Dh]
  __shared__ float s_tile[kTile];
  const int h = blockIdx.x;
  const int64_t t = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const float* q = a.q + (t * a.H + h) * a.Dh;
  for (int d = threadIdx.x; d < a.Dh; d += kThreads) q_s[d] = q[d];

  KeyRange r;
  r.pos = a.pos0 + t;
  r.win_start = r.pos - a.W + 1 > 0 ? r.pos - a.W + 1 : 0;
  r.n_win = r.pos - r.win_start + 1;
  int64_t n_comp = 0;
  if (a.mode == AttnEntries::kVisible) {
    n_comp = (r.pos + 1) / a.ratio;
    if (n_comp > a.n_entries) n_comp = a.n_entries;
  } else if (a.mode == AttnEntries::kSelected) {
    n_comp = a.sel_count[t];
  }
  r.n_keys = r.n_win + n_comp;
  __syncthreads();

  float m = a.sinks[h];  // running max, the sink included
  float l = 1.0f;        // running denominator: exp(sink - m)
  float acc[kPerThread] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int64_t i0 = 0; i0 < r.n_keys; i0 += kTile) {
    const int nk = r.n_keys - i0 < kTile ? int(r.n_keys - i0) : kTile;
    for (int kk = warp; kk < nk; kk += kThreads / 32) {
      const float* k = key_ptr(a, t, r, i0 + kk);
      float d = 0.0f;
      for (int c = lane; c < a.Dh; c += 32) d = fmaf(q_s[c], k[c], d);
      d = warp_sum(d);
      if (lane == 0) s_tile[kk] = d * a.scale;
    }
    __syncthreads();
    float tile_max = -FLT_MAX;
    for (int kk = 0; kk < nk; ++kk) tile_max = fmaxf(tile_max, s_tile[kk]);
    const float m_new = fmaxf(m, tile_max);
    const float corr = expf(m - m_new);
    l *= corr;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) acc[i] *= corr;
    for (int kk = 0; kk < nk; ++kk) {
      const float p = expf(s_tile[kk] - m_new);
      l += p;
      const float* k = key_ptr(a, t, r, i0 + kk);
#pragma unroll
      for (int i = 0; i < kPerThread; ++i) {
        const int d = threadIdx.x + i * kThreads;
        if (d < a.Dh) acc[i] = fmaf(p, k[d], acc[i]);
      }
    }
    m = m_new;
    __syncthreads();  // s_tile is rewritten by the next tile
  }
  const float inv = 1.0f / l;
  float* o = a.out + (t * a.H + h) * a.Dh;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int d = threadIdx.x + i * kThreads;
    if (d < a.Dh) o[d] = acc[i] * inv;
  }
}

}  // namespace

Status attention_sparse(const AttentionArgs& a, cudaStream_t stream) {
  if (a.T == 0) return Status::ok();
  if (a.Dh > kMaxDh) return unsupported("attention: head_dim above 512 is not supported on the GPU");
  if (a.T > 65535) return internal_error("attention: too many queries in one launch");
  const dim3 grid(unsigned(a.H), unsigned(a.T));
  attention_sparse_f32_sm90<<<grid, kThreads, size_t(a.Dh) * sizeof(float), stream>>>(a);
  return launch_status("attention_sparse_f32_sm90");
}

}  // namespace aff::cuda
