// One mHC site per launch (see mhc.h for the four steps), three variants:
//  - hc_prefill_f32_sm90 (hc 4, T > kHcSmallT): a block owns 128 channels of
//    16 tokens, so every mixes-matrix value it stages is used for 16 tokens;
//    the mixes are a small GEMM out of shared memory, the last block of each
//    16-token tile (ticket) finishes those tokens;
//  - hc_fused_small_f32_sm90 (hc 4, T <= kHcSmallT): decode, all blocks of a
//    token meet at one barrier;
//  - hc_fused_f32_sm90 (any other case: hc 1, 2, 8, or shapes the prefill
//    variant's vector loads do not fit): grid (channel blocks, T), one
//    channel per thread covering all hc streams.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/kernels/common/decode.cuh"
#include "backend/cuda/kernels/common/grid_sync.cuh"
#include "backend/cuda/kernels/mhc/mhc.h"
#include "backend/cuda/kernels/mhc/mhc_coeffs.cuh"
#include "backend/cuda/kernels/mhc/mhc_site_decode.cuh"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/pdl.h"
#include "backend/cuda/runtime/smem_limit.h"

namespace aff::cuda {
namespace {

using hc_site::fn_load;
using hc_site::kSmallThreads;
using hc_site::load_expanded;

constexpr int kThreads = 128;
constexpr int kMaxMix = (2 + kMaxHc) * kMaxHc;

// Sum over a block of NT threads of v (every thread gets the total, summed
// in warp order). red: [NT / 32] shared.
template <int NT>
__device__ float block_sum(float v, float* red) {
  v = warp_sum(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < NT / 32; ++w) total += red[w];
  return total;
}

template <int HC, int FNT>
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
  ss = block_sum<kThreads>(ss, red);
  if (threadIdx.x == 0) part[n_mix] = ss;
  // Each warp reduces its rows' partial dots; then one pass over the warps.
  __shared__ float wsum[kThreads / 32][kMaxMix];
  for (int r = 0; r < n_mix; ++r) {
    float p = 0.0f;
    if (d < D) {
#pragma unroll
      for (int j = 0; j < HC; ++j) p = fmaf(fn_load<FNT>(a.fn, int64_t(r) * width + j * D + d), v[j], p);
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
    const float inv = rms_inv(coef[n_mix], float(width), a.norm_eps);
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
  xs = block_sum<kThreads>(xs, red);
  const float inv = rms_inv(xs, float(D), a.norm_eps);
  for (int64_t c = threadIdx.x; c < D; c += kThreads) x[c] = a.x_norm[c] * (x[c] * inv);
}


// Decode variant (hc_site::site_decode_body): all blocks of a token meet at
// one barrier.
template <int HC, int NMIX, int FNT>
__global__ void __launch_bounds__(kSmallThreads) hc_fused_small_f32_sm90(HcFusedArgs a) {
  hc_site::site_decode_body<HC, NMIX, FNT>(a, int(gridDim.x));
}

// Prefill variant (hc 4, T > kHcSmallT). The mixes are a [T, 4D] x [4D, n_mix]
// product; the generic kernel above (a token per block) reads its slice of fn
// again for every token and reduces every row across the block per token,
// (1.26 ms at T = 2048 on an H200, for ~0.1 ms of memory traffic). Here a block
// owns kPfChannels channels (of all four streams) of kPfTokens tokens, grid
// (hc_fused_blocks(D), ceil(T / kPfTokens)):
//   a. the block's slice of fn, [n_mix, 4 x 128], is staged in shared memory
//      as f32 (a weight: loaded before pdl_wait), and serves all 16 tokens;
//   b. h is expanded (when `a` is set) and written back, staged in shared
//      memory as [16 tokens, 4 x 128], and its squares summed per token;
//   c. each thread accumulates an 8-token x n_mix/4-row tile of the partial
//      dots over one of 32 interleaved slices of the block's 512 reduction
//      elements (float4 numbers s, s + 32, s + 64, s + 96); the 32 slices are
//      then summed in slice order through shared memory;
//   d. partials go to global memory and the block takes its tile's ticket;
//      the tile's last block reduces the partials in block order, runs the
//      coefficients (a warp per token) and the collapse and norm (the whole
//      block per token, h read back from L2).
// Every sum has a fixed order, so the result does not depend on scheduling.
constexpr int kPfThreads = 256;
constexpr int kPfWarps = kPfThreads / 32;
constexpr int kPfTokens = 16;
constexpr int kPfChannels = 128;                  // also hc_fused_blocks' unit
constexpr int kPfK = 4 * kPfChannels;             // reduction elements per block (hc 4)
constexpr int kPfK4 = kPfK / 4;                   // ... in float4s
constexpr int kPfSlices = 32;                     // split-K ways
constexpr int kPfIters = kPfK4 / kPfSlices;       // float4s of each slice
constexpr int kPfTileTokens = 8;                  // tokens of a thread's tile
constexpr int kPfMaxGroups = 8;                   // collapse: float4s per thread and token, so D <= 8192
static_assert(kPfTokens == 2 * kPfTileTokens && kPfThreads == 8 * kPfSlices && kPfTokens % kPfWarps == 0,
              "thread layout: 2 token groups x 4 row groups x 32 slices; whole tokens per warp in the expand");

// Dynamic shared memory of the prefill variant: the staged h and fn slices, or
// (in the tail) the tile's partials, whichever is larger.
size_t hc_prefill_smem(int n_mix, int64_t nb) {
  const size_t gemm = size_t(kPfTokens + n_mix) * kPfK * sizeof(float);
  const size_t tail = size_t(kPfTokens) * size_t(nb) * size_t(n_mix + 1) * sizeof(float);
  return std::max(gemm, tail);
}

// The 16-bit fn value in the low half of `bits` (bf16 when FNT == 1, f16 when
// FNT == 2) as f32, exactly.
template <int FNT>
__device__ __forceinline__ float fn16_to_f32(uint32_t bits) {
  if constexpr (FNT == 1) return __uint_as_float(bits << 16);
  else return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
}

template <int NMIX, int FNT>
__global__ void __launch_bounds__(kPfThreads, 2) hc_prefill_f32_sm90(HcFusedArgs a) {
  constexpr int HC = 4;
  constexpr int R = NMIX / 4;                     // rows of a thread's tile
  constexpr int kVals = NMIX + 1;                 // partials per (token, block): the dots, then the sum of squares
  constexpr int kOut = kPfTokens * NMIX;          // partial dots of the block
  constexpr int kRedRow = kOut + 4;               // + 4: a warp's 32 stores of one value land in 32 banks
  static_assert(NMIX % 4 == 0, "n_mix must split into four row groups");
  static_assert(kPfSlices * kRedRow <= (kPfTokens + NMIX) * kPfK, "slice sums must fit the staging space");

  extern __shared__ __align__(16) float pf_smem[];
  float* vs = pf_smem;                            // [kPfTokens, kPfK]: h, k = stream * 128 + channel
  float* fs = pf_smem + kPfTokens * kPfK;         // [NMIX, kPfK]: fn, same k
  __shared__ float ss_s[kPfTokens];               // sum of squares of the block's h per token
  __shared__ float tot_s[kPfTokens][kVals];       // tail: the token's reduced partials
  __shared__ float mix_s[kPfWarps][NMIX];
  __shared__ float pre_s[kPfTokens][HC];
  __shared__ float post_s[kPfWarps][HC], comb_s[kPfWarps][HC * HC];
  __shared__ float red[kPfWarps];
  __shared__ bool last;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t D = a.D, T = a.T, width = HC * D;
  const int nb = gridDim.x;
  const int64_t c0 = int64_t(blockIdx.x) * kPfChannels;
  const int64_t t0 = int64_t(blockIdx.y) * kPfTokens;

  // a. fn slice, 16 bytes per load, all loads issued before the stores.
  //    Unit u covers (row r, stream j, a run of 4 or 8 channels), in fs order.
  if constexpr (FNT == 0) {
    constexpr int kUnits = NMIX * kPfK4 / kPfThreads;
    static_assert(NMIX * kPfK4 % kPfThreads == 0, "fn units per thread");
    const float* fn = reinterpret_cast<const float*>(a.fn);
    float4 f[kUnits];
#pragma unroll
    for (int i = 0; i < kUnits; ++i) {
      const int u = tid + kPfThreads * i;
      const int cq = u & 31, j = (u >> 5) & 3, r = u >> 7;
      const int64_t c = c0 + 4 * cq;
      f[i] = c < D ? __ldg(reinterpret_cast<const float4*>(fn + int64_t(r) * width + j * D + c))
                   : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int i = 0; i < kUnits; ++i) reinterpret_cast<float4*>(fs)[tid + kPfThreads * i] = f[i];
  } else {
    constexpr int kUnits = NMIX * kPfK / 8 / kPfThreads;
    static_assert(NMIX * kPfK / 8 % kPfThreads == 0, "fn units per thread");
    const uint16_t* fn = reinterpret_cast<const uint16_t*>(a.fn);
    uint4 f[kUnits];
#pragma unroll
    for (int i = 0; i < kUnits; ++i) {
      const int u = tid + kPfThreads * i;
      const int c8 = u & 15, j = (u >> 4) & 3, r = u >> 6;
      const int64_t c = c0 + 8 * c8;
      f[i] = c < D ? __ldg(reinterpret_cast<const uint4*>(fn + int64_t(r) * width + j * D + c))
                   : make_uint4(0u, 0u, 0u, 0u);  // 0 bits are +0 in bf16 and f16
    }
#pragma unroll
    for (int i = 0; i < kUnits; ++i) {
      float4* dst = reinterpret_cast<float4*>(fs) + 2 * (tid + kPfThreads * i);
      dst[0] = make_float4(fn16_to_f32<FNT>(f[i].x & 0xffffu), fn16_to_f32<FNT>(f[i].x >> 16),
                           fn16_to_f32<FNT>(f[i].y & 0xffffu), fn16_to_f32<FNT>(f[i].y >> 16));
      dst[1] = make_float4(fn16_to_f32<FNT>(f[i].z & 0xffffu), fn16_to_f32<FNT>(f[i].z >> 16),
                           fn16_to_f32<FNT>(f[i].w & 0xffffu), fn16_to_f32<FNT>(f[i].w >> 16));
    }
  }
  // Everything below reads what earlier kernels wrote. The grid has many waves:
  // the next kernel can only start once every block has passed this point.
  pdl_launch_dependents();
  pdl_wait();

  // b. Warp w takes tokens w and w + 8 of the tile, lane l channels 4l..4l+3
  //    of the block, all four streams. Both tokens' loads go out first (the
  //    expand's stores to h could otherwise alias the second token's loads).
  {
    constexpr int kPer = kPfTokens / kPfWarps;
    float4 v[kPer][HC], av[kPer];
    bool live[kPer];
    const int64_t c = c0 + 4 * lane;
#pragma unroll
    for (int s = 0; s < kPer; ++s) {
      const int64_t t = t0 + warp + kPfWarps * s;
      live[s] = t < T && c < D;
      const float* h = a.h + t * width + c;
#pragma unroll
      for (int j = 0; j < HC; ++j)
        v[s][j] = live[s] ? *reinterpret_cast<const float4*>(h + j * D) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      av[s] = live[s] && a.a ? *reinterpret_cast<const float4*>(a.a + t * D + c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int s = 0; s < kPer; ++s) {
      const int tt = warp + kPfWarps * s;
      const int64_t t = t0 + tt;
      if (live[s] && a.a) {
        // h[k] <- post[k] * a + sum_j comb[j][k] * h[j], per channel as load_expanded.
        const float* post = a.post + t * HC;
        const float* comb = a.comb + t * HC * HC;
        float4 nv[HC];
#pragma unroll
        for (int k = 0; k < HC; ++k) {
          const float pk = post[k];
          float4 o = make_float4(pk * av[s].x, pk * av[s].y, pk * av[s].z, pk * av[s].w);
#pragma unroll
          for (int j = 0; j < HC; ++j) {
            const float w = comb[j * HC + k];
            o.x = fmaf(w, v[s][j].x, o.x);
            o.y = fmaf(w, v[s][j].y, o.y);
            o.z = fmaf(w, v[s][j].z, o.z);
            o.w = fmaf(w, v[s][j].w, o.w);
          }
          nv[k] = o;
        }
        float* h = a.h + t * width + c;
#pragma unroll
        for (int k = 0; k < HC; ++k) {
          v[s][k] = nv[k];
          *reinterpret_cast<float4*>(h + k * D) = nv[k];
        }
      }
      float ss = 0.0f;
#pragma unroll
      for (int j = 0; j < HC; ++j) {
        ss = fmaf(v[s][j].x, v[s][j].x, ss);
        ss = fmaf(v[s][j].y, v[s][j].y, ss);
        ss = fmaf(v[s][j].z, v[s][j].z, ss);
        ss = fmaf(v[s][j].w, v[s][j].w, ss);
        reinterpret_cast<float4*>(vs)[tt * kPfK4 + j * (kPfChannels / 4) + lane] = v[s][j];
      }
      ss = warp_sum(ss);
      if (lane == 0) ss_s[tt] = ss;
    }
  }
  __syncthreads();

  // c. Thread tile: tokens tg*8 .. tg*8+7, rows rg*R .. rg*R+R-1, slice sl.
  //    A quarter warp (8 lanes, one tile) reads 8 consecutive float4s: no
  //    bank conflicts.
  const int mt = (lane >> 3) + 4 * (warp & 1);    // tile number 0..7
  const int tg = mt & 1, rg = mt >> 1;
  const int sl = (warp >> 1) * 8 + (lane & 7);    // slice 0..31
  float acc[kPfTileTokens][R];
#pragma unroll
  for (int q = 0; q < kPfTileTokens; ++q)
#pragma unroll
    for (int p = 0; p < R; ++p) acc[q][p] = 0.0f;
  {
    const float4* vs4 = reinterpret_cast<const float4*>(vs);
    const float4* fs4 = reinterpret_cast<const float4*>(fs);
#pragma unroll 1  // unrolled, the next slice's loads were hoisted and the 48 accumulators spilled
    for (int i = 0; i < kPfIters; ++i) {
      const int kc = sl + kPfSlices * i;
      float4 f[R];
#pragma unroll
      for (int p = 0; p < R; ++p) f[p] = fs4[(rg * R + p) * kPfK4 + kc];
#pragma unroll
      for (int q = 0; q < kPfTileTokens; ++q) {
        const float4 v = vs4[(tg * kPfTileTokens + q) * kPfK4 + kc];
#pragma unroll
        for (int p = 0; p < R; ++p) {
          float s = acc[q][p];
          s = fmaf(v.x, f[p].x, s);
          s = fmaf(v.y, f[p].y, s);
          s = fmaf(v.z, f[p].z, s);
          s = fmaf(v.w, f[p].w, s);
          acc[q][p] = s;
        }
      }
    }
  }
  __syncthreads();  // vs and fs are dead; the slice sums reuse the space
  // red_s[slice][m], m = (q * R + p) * 8 + tile: output m of every slice.
  float* red_s = pf_smem;
#pragma unroll
  for (int q = 0; q < kPfTileTokens; ++q)
#pragma unroll
    for (int p = 0; p < R; ++p) red_s[sl * kRedRow + (q * R + p) * 8 + mt] = acc[q][p];
  __syncthreads();
  for (int m = tid; m < kOut; m += kPfThreads) {
    float s = 0.0f;
    for (int k = 0; k < kPfSlices; ++k) s += red_s[k * kRedRow + m];
    const int tile = m & 7, o = m >> 3;
    const int tt = (tile & 1) * kPfTileTokens + o / R, r = (tile >> 1) * R + o % R;
    if (t0 + tt < T) a.partials[((t0 + tt) * nb + blockIdx.x) * kVals + r] = s;
  }
  if (tid < kPfTokens && t0 + tid < T) a.partials[((t0 + tid) * nb + blockIdx.x) * kVals + NMIX] = ss_s[tid];

  // d. Publish the partials and the expanded h, then take the tile's ticket.
  __threadfence();
  __syncthreads();
  if (tid == 0) last = atomicAdd(a.tickets + blockIdx.y, 1u) == unsigned(nb - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();

  const int nt = int(min(int64_t(kPfTokens), T - t0));
  // The tile's partials ([nt, nb, kVals], contiguous) into shared memory all
  // at once, then each (token, value) summed in block order.
  float* staged = pf_smem;
  const float* src = a.partials + t0 * nb * kVals;
  for (int i = tid; i < nt * nb * kVals; i += kPfThreads) staged[i] = __ldcg(src + i);
  __syncthreads();
  for (int o = tid; o < nt * kVals; o += kPfThreads) {
    const int tt = o / kVals, r = o % kVals;
    float s = 0.0f;
    for (int b = 0; b < nb; ++b) s += staged[(tt * nb + b) * kVals + r];
    tot_s[tt][r] = s;
  }
  __syncthreads();
  // Coefficients: warp w takes tokens w, w + 8 (the same arithmetic as the
  // other variants: mixes scaled by the flatten norm, hc_coefficients_warp).
  for (int tt = warp; tt < nt; tt += kPfWarps) {
    const int64_t t = t0 + tt;
    const float inv = rms_inv(tot_s[tt][NMIX], float(width), a.norm_eps);
    for (int r = lane; r < NMIX; r += 32) mix_s[warp][r] = tot_s[tt][r] * inv;
    __syncwarp();
    hc_coefficients_warp(mix_s[warp], a.base, a.scale, HC, a.sinkhorn_iters, a.hc_eps, a.head, pre_s[tt],
                         post_s[warp], comb_s[warp]);
    __syncwarp();
    if (lane < HC) a.pre[t * HC + lane] = pre_s[tt][lane];
    if (!a.head) {
      if (lane < HC) a.post[t * HC + lane] = post_s[warp][lane];
      if (lane < HC * HC) a.comb[t * HC * HC + lane] = comb_s[warp][lane];
    }
    __syncwarp();  // mix_s, post_s, comb_s are reused for the warp's next token
  }
  if (tid == 0) a.tickets[blockIdx.y] = 0;  // ready for the next launch
  __syncthreads();

  // Collapse and x's norm, one token at a time over the whole block; h was
  // written by other blocks of this launch, so it is read from L2 (__ldcg).
  for (int tt = 0; tt < nt; ++tt) {
    const int64_t t = t0 + tt;
    const float* h = a.h + t * width;
    float pre[HC];
#pragma unroll
    for (int j = 0; j < HC; ++j) pre[j] = pre_s[tt][j];
    float4 xv[kPfMaxGroups];
    float xs = 0.0f;
#pragma unroll
    for (int i = 0; i < kPfMaxGroups; ++i) {
      const int64_t c = 4 * (int64_t(tid) + int64_t(kPfThreads) * i);
      xv[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (c < D) {
        float4 hv[HC];
#pragma unroll
        for (int j = 0; j < HC; ++j) hv[j] = __ldcg(reinterpret_cast<const float4*>(h + j * D + c));
        float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int j = 0; j < HC; ++j) {
          s.x = fmaf(pre[j], hv[j].x, s.x);
          s.y = fmaf(pre[j], hv[j].y, s.y);
          s.z = fmaf(pre[j], hv[j].z, s.z);
          s.w = fmaf(pre[j], hv[j].w, s.w);
        }
        xv[i] = s;
        xs = fmaf(s.x, s.x, xs);
        xs = fmaf(s.y, s.y, xs);
        xs = fmaf(s.z, s.z, xs);
        xs = fmaf(s.w, s.w, xs);
      }
    }
    if (a.x_norm) {
      xs = block_sum<kPfThreads>(xs, red);
      const float inv = rms_inv(xs, float(D), a.norm_eps);
#pragma unroll
      for (int i = 0; i < kPfMaxGroups; ++i) {
        const int64_t c = 4 * (int64_t(tid) + int64_t(kPfThreads) * i);
        if (c < D) {
          const float4 w = *reinterpret_cast<const float4*>(a.x_norm + c);
          xv[i] = make_float4(w.x * (xv[i].x * inv), w.y * (xv[i].y * inv), w.z * (xv[i].z * inv),
                              w.w * (xv[i].w * inv));
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kPfMaxGroups; ++i) {
      const int64_t c = 4 * (int64_t(tid) + int64_t(kPfThreads) * i);
      if (c < D) *reinterpret_cast<float4*>(a.x + t * D + c) = xv[i];
    }
  }
}

}  // namespace

int hc_fused_blocks(int64_t D) { return int((D + kThreads - 1) / kThreads); }

int hc_decode_blocks(int64_t D) { return int((D + kSmallThreads - 1) / kSmallThreads); }

bool hc_site_iw_supported(int64_t D, int heads) {
  return D > 0 && D % kSmallThreads == 0 && heads >= 1 && heads <= (kSmallThreads / 32) * hc_site::IwSlice::kHeadsPerWarp;
}

namespace {

static_assert(kPfChannels == kThreads, "the prefill variant's channel blocks are hc_fused_blocks'");

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// The prefill variant's vector loads need whole 16-byte runs of fn and h
// (D a multiple of 4 for f32 fn, of 8 for 16-bit fn) at 16-byte aligned
// addresses, D <= kPfMaxGroups * 4 * kPfThreads for the collapse, and its
// shared memory within the device limit.
bool hc_prefill_takes(const HcFusedArgs& a) {
  if (a.hc != 4 || a.T <= kHcSmallT) return false;
  if (a.fn_dtype < 0 || a.fn_dtype > 2) return false;
  if (a.D % (a.fn_dtype == 0 ? 4 : 8) != 0 || a.D > int64_t(kPfMaxGroups) * 4 * kPfThreads) return false;
  if (!aligned16(a.h) || !aligned16(a.fn) || !aligned16(a.x) || (a.a && !aligned16(a.a)) ||
      (a.x_norm && !aligned16(a.x_norm)))
    return false;
  return hc_prefill_smem(a.head ? 4 : 24, hc_fused_blocks(a.D)) <= 200 * 1024;
}

Status hc_prefill(const HcFusedArgs& a, cudaStream_t stream) {
  using Kernel = void (*)(HcFusedArgs);
  Kernel k = nullptr;
  switch (a.fn_dtype * 2 + (a.head ? 1 : 0)) {
    case 0: k = hc_prefill_f32_sm90<24, 0>; break;
    case 1: k = hc_prefill_f32_sm90<4, 0>; break;
    case 2: k = hc_prefill_f32_sm90<24, 1>; break;
    case 3: k = hc_prefill_f32_sm90<4, 1>; break;
    case 4: k = hc_prefill_f32_sm90<24, 2>; break;
    case 5: k = hc_prefill_f32_sm90<4, 2>; break;
    default: return internal_error("hc_fused: unknown mixes dtype");
  }
  const int64_t nb = hc_fused_blocks(a.D);
  const size_t smem = hc_prefill_smem(a.head ? 4 : 24, nb);
  AFF_RETURN_IF_ERROR(raise_smem_limit(reinterpret_cast<const void*>(k), int(smem)));
  const dim3 grid(unsigned(nb), unsigned((a.T + kPfTokens - 1) / kPfTokens));
  return cuda_status(launch_pdl(k, grid, dim3(kPfThreads), smem, stream, a), "hc_prefill_f32_sm90");
}

template <int HC>
Status hc_fused_generic(const HcFusedArgs& a, dim3 grid, size_t smem, cudaStream_t stream) {
  switch (a.fn_dtype) {
    case 0: hc_fused_f32_sm90<HC, 0><<<grid, kThreads, smem, stream>>>(a); break;
    case 1: hc_fused_f32_sm90<HC, 1><<<grid, kThreads, smem, stream>>>(a); break;
    case 2: hc_fused_f32_sm90<HC, 2><<<grid, kThreads, smem, stream>>>(a); break;
    default: return internal_error("hc_fused: unknown mixes dtype");
  }
  return launch_status("hc_fused_f32_sm90");
}

// A deferred comb's Sinkhorn as a launch of its own (HcCombJob, for a
// consumer that cannot run it beside its work).
__global__ void __launch_bounds__(256) hc_comb_f32_sm90(HcCombJob j) {
  pdl_start();  // runtime/pdl.h: nothing in this kernel runs before the wait
  hc_comb_job_run(j);
}

}  // namespace

Status hc_comb_run(const HcCombJob& j, cudaStream_t stream) {
  if (j.comb == nullptr || j.T <= 0) return Status::ok();
  if (j.hc * j.hc > 32) return internal_error("hc_comb_run: hc * hc must be at most 32");
  const unsigned warps = unsigned(std::min<int64_t>(j.T, 8));
  return cuda_status(launch_pdl(hc_comb_f32_sm90, dim3(1), dim3(32 * warps), 0, stream, j), "hc_comb_f32_sm90");
}

Status hc_fused(const HcFusedArgs& a, cudaStream_t stream) {
  if (a.T == 0) return Status::ok();
  if (a.T > 65535) return internal_error("hc_fused: too many tokens in one launch");
  if (a.defer_comb && !(a.T <= kHcSmallT && a.hc == 4 && !a.head))
    return internal_error("hc_fused: only the decode variant leaves comb to a job");
  if (a.x_ring_rows > 0 && !(a.T == 1 && a.hc == 4 && a.step != nullptr))
    return internal_error("hc_fused: only a one-token decode site writes the x rings");
  if (a.iw_parts != nullptr &&
      !(a.T <= kHcSmallT && a.hc == 4 && !a.head && hc_site_iw_supported(a.D, a.iw_heads) &&
        reinterpret_cast<uintptr_t>(a.iw_weight) % 8 == 0))
    return internal_error("hc_fused: the indexer's head weights need the decode site, whole blocks of channels and "
                          "at most 64 heads");
  if (a.T <= kHcSmallT && a.hc == 4) {
    const dim3 grid(unsigned(hc_decode_blocks(a.D)), unsigned(a.T));
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
  if (hc_prefill_takes(a)) return hc_prefill(a, stream);
  const dim3 grid(unsigned(hc_fused_blocks(a.D)), unsigned(a.T));
  const size_t smem = size_t(grid.x) * size_t((a.head ? a.hc : (2 + a.hc) * a.hc) + 1) * 4;
  if (smem > 48 * 1024) return unsupported("mHC: hidden size too large for the fused kernel's reduction");
  switch (a.hc) {
    case 1: return hc_fused_generic<1>(a, grid, smem, stream);
    case 2: return hc_fused_generic<2>(a, grid, smem, stream);
    case 4: return hc_fused_generic<4>(a, grid, smem, stream);
    case 8: return hc_fused_generic<8>(a, grid, smem, stream);
    default: return unsupported("mHC: hc_mult " + std::to_string(a.hc) + " is not supported by the fused kernel");
  }
}

}  // namespace aff::cuda
