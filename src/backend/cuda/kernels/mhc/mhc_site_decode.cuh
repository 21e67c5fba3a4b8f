// The decode mHC site (T <= kHcSmallT, hc 4) as a block body, shared by the
// site's own launch (mhc_fused.cu) and the launch that runs the MoE router's
// gate beside it (moe/site_router.cu), plus the per-element helpers the other
// site variants use too.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/kernels/common/decode.cuh"
#include "backend/cuda/kernels/common/grid_sync.cuh"
#include "backend/cuda/kernels/mhc/mhc.h"
#include "backend/cuda/kernels/mhc/mhc_coeffs.cuh"
#include "backend/cuda/runtime/pdl.h"

namespace aff::cuda::hc_site {

// fn element i with its dtype known at compile time (FNT = HcFusedArgs::fn_dtype):
// a per-element switch kept the compiler from batching a thread's 96 loads.
template <int FNT>
__device__ __forceinline__ float fn_load(const void* fn, int64_t i) {
  if constexpr (FNT == 1) return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(fn)[i]);
  else if constexpr (FNT == 2) return __half2float(reinterpret_cast<const __half*>(fn)[i]);
  else return reinterpret_cast<const float*>(fn)[i];
}

// Loads channel d of the HC streams of token t into v and, when the site has
// a previous sublayer output, applies that sublayer's hc_post to them in
// place (h[k] <- post[k] * a + sum_j comb[j][k] * h[j]). Dead lanes get zeros.
template <int HC>
__device__ __forceinline__ void load_expanded(const HcFusedArgs& a, float* h, int64_t t, int64_t d, bool live,
                                              float (&v)[HC]) {
  const int64_t D = a.D;
#pragma unroll
  for (int j = 0; j < HC; ++j) v[j] = live ? h[j * D + d] : 0.0f;
  if (!a.a || !live) return;
  const float av = a.a[t * D + d];
  const float* post = a.post + t * HC;
  const float* comb = a.comb + t * HC * HC;
  float nv[HC];
#pragma unroll
  for (int k = 0; k < HC; ++k) {
    float o = post[k] * av;
#pragma unroll
    for (int j = 0; j < HC; ++j) o = fmaf(comb[j * HC + k], v[j], o);
    nv[k] = o;
  }
#pragma unroll
  for (int k = 0; k < HC; ++k) {
    v[k] = nv[k];
    h[k * D + d] = nv[k];
  }
}

// Decode variant (T <= kSmallT): every block of a token meets at a barrier
// instead of leaving the tail to the last block, so the collapse and norm
// stay spread over all blocks. x's norm comes from the Gram matrix of the
// streams (|sum_j pre_j h_j|^2 = sum_jk pre_j pre_k <h_j, h_k>), whose partial
// sums ride along with the mixes', so one barrier is enough. The grid
// (kSmallBlocks x T blocks of kThreads) always fits on the GPU at once, which
// the barrier needs. All fn loads of a thread are issued before any is used.
constexpr int kSmallThreads = 128;

// The next attention's indexer head weights over one block's channels
// (HcFusedArgs::iw_weight): warp w takes heads [16 w, 16 w + 16), lane l the
// block's channels [4 l, 4 l + 4). load() issues the weight loads (while the
// site's barrier waits), finish() dots them with the block's x and writes the
// block's partial sums.
struct IwSlice {
  static constexpr int kHeadsPerWarp = 16;
  uint2 w[kHeadsPerWarp];  // 4 BF16 weights per head

  __device__ __forceinline__ void load(const HcFusedArgs& a) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t c = int64_t(blockIdx.x) * kSmallThreads + 4 * lane;
#pragma unroll
    for (int i = 0; i < kHeadsPerWarp; ++i) {
      const int h = warp * kHeadsPerWarp + i;
      w[i] = h < a.iw_heads ? __ldg(reinterpret_cast<const uint2*>(a.iw_weight + (int64_t(h) * a.D + c) * 2))
                            : make_uint2(0u, 0u);
    }
  }

  // xs: [kSmallThreads] the block's x (shared).
  __device__ __forceinline__ void finish(const HcFusedArgs& a, const float* xs, int64_t t, int nb) const {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const float4 xv = reinterpret_cast<const float4*>(xs)[lane];
    float v[32];
#pragma unroll
    for (int i = 0; i < kHeadsPerWarp; ++i) {
      float p = bf16_bits_to_f32(uint16_t(w[i].x)) * xv.x;
      p = fmaf(bf16_bits_to_f32(uint16_t(w[i].x >> 16)), xv.y, p);
      p = fmaf(bf16_bits_to_f32(uint16_t(w[i].y)), xv.z, p);
      v[i] = fmaf(bf16_bits_to_f32(uint16_t(w[i].y >> 16)), xv.w, p);
    }
#pragma unroll
    for (int i = kHeadsPerWarp; i < 32; ++i) v[i] = 0.0f;
    const float s = warp_sum_each(v);  // lane i: head warp * 16 + i's sum over the block's channels
    const int h = warp * kHeadsPerWarp + lane;
    if (lane < kHeadsPerWarp && h < a.iw_heads) a.iw_parts[(t * nb + blockIdx.x) * a.iw_heads + h] = s;
  }
};

// The body of one decode site block; blocks [0, nb) of grid row t = blockIdx.y
// are the token's site (a launch may hold other blocks after them: the site
// and router launch, moe/site_router.cu). Must be called by all kSmallThreads
// threads of the block.
template <int HC, int NMIX, int FNT>
__device__ __forceinline__ void site_decode_body(const HcFusedArgs& a, int nb) {
  constexpr int kGram = HC * (HC + 1) / 2;
  constexpr int kVals = NMIX + kGram;
  constexpr int kWarps = kSmallThreads / 32;
  __shared__ float wsum[kWarps][kVals];
  __shared__ float tot[kVals];
  __shared__ float coef[HC], post[HC], comb[HC * HC], mix[NMIX];
  const int64_t t = blockIdx.y;
  const int64_t D = a.D, width = HC * D;
  float* h = a.h + t * width;
  const int64_t d = int64_t(blockIdx.x) * kSmallThreads + threadIdx.x;
  const bool live = d < D;

  // The mixes matrix is a weight: its loads go out before waiting for the
  // previous kernel (programmatic dependent launch, runtime/pdl.h).
  float f[NMIX][HC];
#pragma unroll
  for (int r = 0; r < NMIX; ++r)
#pragma unroll
    for (int j = 0; j < HC; ++j) f[r][j] = live ? fn_load<FNT>(a.fn, int64_t(r) * width + j * D + d) : 0.0f;
  pdl_launch_dependents();  // the whole grid is resident (the barrier below needs it anyway)
  pdl_wait();

  float v[HC];
  load_expanded<HC>(a, h, t, d, live, v);
  if (a.h_copy != nullptr && live) {
#pragma unroll
    for (int k = 0; k < HC; ++k) a.h_copy[t * width + k * D + d] = v[k];
  }
  float vals[kVals];
#pragma unroll
  for (int r = 0; r < NMIX; ++r) {
    float p = 0.0f;
#pragma unroll
    for (int j = 0; j < HC; ++j) p = fmaf(f[r][j], v[j], p);
    vals[r] = p;
  }
  {
    int g = NMIX;
#pragma unroll
    for (int j = 0; j < HC; ++j)
#pragma unroll
      for (int k = j; k < HC; ++k) vals[g++] = v[j] * v[k];
  }
  {
    // The first 32 values in one butterfly (31 shuffles instead of 5 per
    // value): lane l ends with the warp's sum of value l. Any others by
    // warp_sum.
    const int lane = threadIdx.x & 31;
    float v32[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) v32[i] = i < kVals ? vals[i] : 0.0f;
    const float mine = warp_sum_each(v32);
    if (lane < kVals) wsum[threadIdx.x >> 5][lane] = mine;
#pragma unroll
    for (int i = 32; i < kVals; ++i) {
      const float w = warp_sum(vals[i]);
      if (lane == 0) wsum[threadIdx.x >> 5][i] = w;
    }
  }
  __syncthreads();
  float* part = a.partials + (t * nb + blockIdx.x) * kVals;
  if (threadIdx.x < kVals) {
    float p = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) p += wsum[w][threadIdx.x];
    part[threadIdx.x] = p;
  }

  // Barrier over the token's blocks (the last to leave resets it, below).
  unsigned* arrive = a.tickets + 2 * t;
  unsigned* depart = arrive + 1;
  grid_arrive(arrive);
  IwSlice iw;
  if (a.iw_parts != nullptr) iw.load(a);  // weights: while the barrier waits
  grid_wait(arrive, unsigned(nb));

  // Every block reduces the partials in block order (the same sums in every
  // block), from a shared-memory copy loaded all at once.
  extern __shared__ float staged[];  // [nb, kVals]
  for (int i = threadIdx.x; i < nb * kVals; i += kSmallThreads) staged[i] = __ldcg(a.partials + t * nb * kVals + i);
  __syncthreads();
  if (threadIdx.x < kVals) {
    float p = 0.0f;
    for (int b = 0; b < nb; ++b) p += staged[b * kVals + threadIdx.x];
    tot[threadIdx.x] = p;
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    float ss = 0.0f;
    {
      int g = NMIX;
      for (int j = 0; j < HC; ++j)
        for (int k = j; k < HC; ++k, ++g)
          if (j == k) ss += tot[g];
    }
    const float inv = rms_inv(ss, float(width), a.norm_eps);
    if (lane < NMIX) mix[lane] = tot[lane] * inv;
    __syncwarp();
    hc_coefficients_warp(mix, a.base, a.scale, HC, a.sinkhorn_iters, a.hc_eps, a.head, coef, post, comb,
                         !a.defer_comb);
    __syncwarp();
    if (blockIdx.x == 0) {
      if (lane < HC) a.pre[t * HC + lane] = coef[lane];
      if (!a.head) {
        if (lane < HC) a.post[t * HC + lane] = post[lane];
        if (lane < HC * HC) a.comb[t * HC * HC + lane] = comb[lane];
        if (a.post_copy != nullptr && lane < HC) a.post_copy[t * HC + lane] = post[lane];
        // A deferred comb reaches its copy through the job (HcCombJob::copy).
        if (a.comb_copy != nullptr && !a.defer_comb && lane < HC * HC) a.comb_copy[t * HC * HC + lane] = comb[lane];
      }
    }
    if (lane == 0) {
      // Every block has read the partials: the last to leave resets the barrier.
      if (atomicAdd(depart, 1u) == unsigned(nb - 1)) *arrive = 0, *depart = 0;
      // |x|^2 from the Gram matrix, kept in tot[0] for the block.
      float xx = 0.0f;
      int g = NMIX;
      for (int j = 0; j < HC; ++j)
        for (int k = j; k < HC; ++k, ++g) xx += (j == k ? 1.0f : 2.0f) * coef[j] * coef[k] * tot[g];
      tot[0] = xx;
      if (blockIdx.x == 0 && a.x_inv != nullptr) a.x_inv[t] = rms_inv(fmaxf(xx, 0.0f), float(D), a.norm_eps);
    }
  }
  __syncthreads();
  float x = 0.0f;
  if (live) {
#pragma unroll
    for (int j = 0; j < HC; ++j) x = fmaf(coef[j], v[j], x);
    if (a.x_norm) x = a.x_norm[d] * (x * rms_inv(fmaxf(tot[0], 0.0f), float(D), a.norm_eps));
    a.x[t * D + d] = x;
    if (a.x_ring_rows > 0) {  // one token (the host checks)
      const int64_t row = a.step->pos0 % a.x_ring_rows;
#pragma unroll
      for (int k = 0; k < 2; ++k)
        if (a.x_ring[k] != nullptr) a.x_ring[k][row * D + d] = x;
    }
  }
  if (a.iw_parts == nullptr) return;  // uniform over the grid
  __shared__ __align__(16) float x_block[kSmallThreads];
  x_block[threadIdx.x] = x;  // every channel live (hc_site_iw_supported)
  __syncthreads();
  iw.finish(a, x_block, t, nb);
}

}  // namespace aff::cuda::hc_site
