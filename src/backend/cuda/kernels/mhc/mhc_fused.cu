// hc_fused_f32_sm90: grid (channel blocks, T), kThreads threads, one channel d
// per thread covering all hc streams; see mhc.h for the four steps.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backend/cuda/kernels/common/decode.cuh"
#include "backend/cuda/kernels/mhc/mhc.h"
#include "backend/cuda/kernels/mhc/mhc_coeffs.cuh"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/pdl.h"

namespace aff::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxMix = (2 + kMaxHc) * kMaxHc;

// fn element i with its dtype known at compile time (FNT = HcFusedArgs::fn_dtype):
// a per-element switch kept the compiler from batching a thread's 96 loads.
template <int FNT>
__device__ __forceinline__ float fn_load(const void* fn, int64_t i) {
  if constexpr (FNT == 1) return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(fn)[i]);
  else if constexpr (FNT == 2) return __half2float(reinterpret_cast<const __half*>(fn)[i]);
  else return reinterpret_cast<const float*>(fn)[i];
}

__device__ __forceinline__ float fn_at(const HcFusedArgs& a, int64_t i) {
  switch (a.fn_dtype) {
    case 1: return fn_load<1>(a.fn, i);
    case 2: return fn_load<2>(a.fn, i);
    default: return fn_load<0>(a.fn, i);
  }
}

// Sum over the block of v (every thread gets the total).
__device__ float block_sum(float v, float* red) {
  v = warp_sum(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) total += red[w];
  return total;
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

template <int HC>
__global__ void __launch_bounds__(kThreads) hc_fused_f32_sm90(HcFusedArgs a) {
  __shared__ float red[kThreads / 32];
  __shared__ float coef[kMaxMix + 1], mix[kMaxMix], post[HC], comb[HC * HC];
  __shared__ bool last;
  const int64_t t = blockIdx.y;
  const int64_t D = a.D, width = HC * D;
  const int n_mix = a.head ? HC : (2 + HC) * HC;
  const int nb = gridDim.x;
  float* h = a.h + t * width;
  const int64_t d = int64_t(blockIdx.x) * kThreads + threadIdx.x;

  // 1. expand (this thread owns channel d of every stream: no other block touches it).
  float v[HC];
  load_expanded<HC>(a, h, t, d, d < D, v);

  // 2. partial dots of every mix row with this block's channels, and the sum of squares.
  float* part = a.partials + (t * nb + blockIdx.x) * (n_mix + 1);
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < HC; ++j) ss = fmaf(v[j], v[j], ss);
  ss = block_sum(ss, red);
  if (threadIdx.x == 0) part[n_mix] = ss;
  // Each warp reduces its rows' partial dots; then one pass over the warps.
  __shared__ float wsum[kThreads / 32][kMaxMix];
  for (int r = 0; r < n_mix; ++r) {
    float p = 0.0f;
    if (d < D) {
#pragma unroll
      for (int j = 0; j < HC; ++j) p = fmaf(fn_at(a, int64_t(r) * width + j * D + d), v[j], p);
    }
    p = warp_sum(p);
    if ((threadIdx.x & 31) == 0) wsum[threadIdx.x >> 5][r] = p;
  }
  __syncthreads();
  if (threadIdx.x < n_mix) {
    float p = 0.0f;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) p += wsum[w][threadIdx.x];
    part[threadIdx.x] = p;
  }

  // Publish the partials (and the expanded h), then take a ticket.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(a.tickets + t, 1u) == unsigned(nb - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();

  // 3. reduce in block order, coefficients.
  // All partials at once into shared memory (a loop of dependent L2 reads
  // would pay the latency nb times), then sums in block order.
  extern __shared__ float staged[];  // [nb, n_mix + 1]
  for (int i = threadIdx.x; i < nb * (n_mix + 1); i += kThreads)
    staged[i] = __ldcg(a.partials + t * nb * (n_mix + 1) + i);
  __syncthreads();
  if (threadIdx.x <= n_mix) {
    float s = 0.0f;
    for (int b = 0; b < nb; ++b) s += staged[b * (n_mix + 1) + threadIdx.x];
    coef[threadIdx.x] = s;
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    const float inv = 1.0f / sqrtf(coef[n_mix] / float(width) + a.norm_eps);
    __syncwarp();
    for (int r = lane; r < n_mix; r += 32) mix[r] = coef[r] * inv;
    __syncwarp();
    if (HC * HC <= 32) {
      hc_coefficients_warp(mix, a.base, a.scale, HC, a.sinkhorn_iters, a.hc_eps, a.head, coef, post, comb);
    } else if (lane == 0) {
      hc_coefficients(mix, a.base, a.scale, HC, a.sinkhorn_iters, a.hc_eps, a.head, coef, post, comb);
    }
    __syncwarp();
    if (lane < HC) a.pre[t * HC + lane] = coef[lane];
    if (!a.head) {
      if (lane < HC) a.post[t * HC + lane] = post[lane];
      for (int i = lane; i < HC * HC; i += 32) a.comb[t * HC * HC + i] = comb[i];
    }
    if (lane == 0) a.tickets[t] = 0;  // ready for the next launch (graph replays reuse it)
  }
  __syncthreads();

  // 4. collapse and the sublayer's rmsnorm.
  float* x = a.x + t * D;
  float xs = 0.0f;
  for (int64_t c = threadIdx.x; c < D; c += kThreads) {
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < HC; ++j) s = fmaf(coef[j], __ldcg(h + j * D + c), s);
    x[c] = s;
    xs = fmaf(s, s, xs);
  }
  if (!a.x_norm) return;
  xs = block_sum(xs, red);
  const float inv = 1.0f / sqrtf(xs / float(D) + a.norm_eps);
  for (int64_t c = threadIdx.x; c < D; c += kThreads) x[c] = a.x_norm[c] * (x[c] * inv);
}


// Decode variant (T <= kSmallT): every block of a token meets at a barrier
// instead of leaving the tail to the last block, so the collapse and norm
// stay spread over all blocks. x's norm comes from the Gram matrix of the
// streams (|sum_j pre_j h_j|^2 = sum_jk pre_j pre_k <h_j, h_k>), whose partial
// sums ride along with the mixes', so one barrier is enough. The grid
// (kSmallBlocks x T blocks of kThreads) always fits on the GPU at once, which
// the barrier needs. All fn loads of a thread are issued before any is used.
constexpr int kSmallThreads = 128;

template <int HC, int NMIX, int FNT>
__global__ void __launch_bounds__(kSmallThreads) hc_fused_small_f32_sm90(HcFusedArgs a) {
  constexpr int kGram = HC * (HC + 1) / 2;
  constexpr int kVals = NMIX + kGram;
  constexpr int kWarps = kSmallThreads / 32;
  __shared__ float wsum[kWarps][kVals];
  __shared__ float tot[kVals];
  __shared__ float coef[HC], post[HC], comb[HC * HC], mix[NMIX];
  const int64_t t = blockIdx.y;
  const int64_t D = a.D, width = HC * D;
  const int nb = gridDim.x;
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
#pragma unroll
  for (int i = 0; i < kVals; ++i) {
    const float w = warp_sum(vals[i]);
    if ((threadIdx.x & 31) == 0) wsum[threadIdx.x >> 5][i] = w;
  }
  __syncthreads();
  float* part = a.partials + (t * nb + blockIdx.x) * kVals;
  if (threadIdx.x < kVals) {
    float p = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) p += wsum[w][threadIdx.x];
    part[threadIdx.x] = p;
  }

  // Barrier over the token's blocks: arrive, wait, and the last to leave resets.
  __threadfence();
  __syncthreads();
  unsigned* arrive = a.tickets + 2 * t;
  unsigned* depart = arrive + 1;
  if (threadIdx.x == 0) {
    atomicAdd(arrive, 1u);
    // Poll with plain acquire loads: atomics from every block on one word serialise.
    unsigned seen = 0;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(seen) : "l"(arrive) : "memory");
    } while (seen < unsigned(nb));
  }
  __syncthreads();  // orders the block after thread 0's acquire

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
    const float inv = 1.0f / sqrtf(ss / float(width) + a.norm_eps);
    if (lane < NMIX) mix[lane] = tot[lane] * inv;
    __syncwarp();
    hc_coefficients_warp(mix, a.base, a.scale, HC, a.sinkhorn_iters, a.hc_eps, a.head, coef, post, comb);
    __syncwarp();
    if (blockIdx.x == 0) {
      if (lane < HC) a.pre[t * HC + lane] = coef[lane];
      if (!a.head) {
        if (lane < HC) a.post[t * HC + lane] = post[lane];
        if (lane < HC * HC) a.comb[t * HC * HC + lane] = comb[lane];
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
    }
  }
  __syncthreads();
  if (!live) return;
  float x = 0.0f;
#pragma unroll
  for (int j = 0; j < HC; ++j) x = fmaf(coef[j], v[j], x);
  if (a.x_norm) x = a.x_norm[d] * (x * (1.0f / sqrtf(fmaxf(tot[0], 0.0f) / float(D) + a.norm_eps)));
  a.x[t * D + d] = x;
}

}  // namespace

int hc_fused_blocks(int64_t D) { return int((D + kThreads - 1) / kThreads); }

Status hc_fused(const HcFusedArgs& a, cudaStream_t stream) {
  if (a.T == 0) return Status::ok();
  if (a.T > 65535) return internal_error("hc_fused: too many tokens in one launch");
  if (a.T <= kHcSmallT && a.hc == 4) {
    const dim3 grid(unsigned((a.D + kSmallThreads - 1) / kSmallThreads), unsigned(a.T));
    const size_t nb = grid.x;
    const dim3 block(kSmallThreads);
    cudaError_t e;
#define AFF_HC_SMALL(FNT_)                                                                                 \
  case FNT_:                                                                                               \
    e = a.head ? launch_pdl(hc_fused_small_f32_sm90<4, 4, FNT_>, grid, block, nb * (4 + 10) * 4, stream, a) \
               : launch_pdl(hc_fused_small_f32_sm90<4, 24, FNT_>, grid, block, nb * (24 + 10) * 4, stream, a); \
    break;
    switch (a.fn_dtype) {
      AFF_HC_SMALL(0)
      AFF_HC_SMALL(1)
      AFF_HC_SMALL(2)
      default: return internal_error("hc_fused: unknown mixes dtype");
    }
#undef AFF_HC_SMALL
    return cuda_status(e, "hc_fused_small_f32_sm90");
  }
  const dim3 grid(unsigned(hc_fused_blocks(a.D)), unsigned(a.T));
  const size_t smem = size_t(grid.x) * size_t((a.head ? a.hc : (2 + a.hc) * a.hc) + 1) * 4;
  if (smem > 48 * 1024) return unsupported("mHC: hidden size too large for the fused kernel's reduction");
  switch (a.hc) {
    case 1: hc_fused_f32_sm90<1><<<grid, kThreads, smem, stream>>>(a); break;
    case 2: hc_fused_f32_sm90<2><<<grid, kThreads, smem, stream>>>(a); break;
    case 4: hc_fused_f32_sm90<4><<<grid, kThreads, smem, stream>>>(a); break;
    case 8: hc_fused_f32_sm90<8><<<grid, kThreads, smem, stream>>>(a); break;
    default: return unsupported("mHC: hc_mult " + std::to_string(a.hc) + " is not supported by the fused kernel");
  }
  return launch_status("hc_fused_f32_sm90");
}

}  // namespace aff::cuda
