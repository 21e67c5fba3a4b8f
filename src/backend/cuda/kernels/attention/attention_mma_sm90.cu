// attention_mma_sm90: one block of 8 warps per (key split, query, group of 64
// heads). The block stages its queries once in shared memory as bf16 (hi + lo
// pairs in kBf16x3), then walks its keys in tiles of 32:
//   1. converts the tile's keys (f32 in the ring, the chunk or the compressed
//      entries) to bf16 in shared memory: each key is read once per block,
//      for all 64 heads;
//   2. S[64 x 32] = Q K^T on tensor cores (warp = 16 heads x 16 keys);
//   3. online softmax per head row (warp = 8 rows, lane = key);
//   4. O[64 x Dh] += P K on tensor cores (warp = 64 heads x Dh/8 channels,
//      accumulators stay in registers for the whole walk).
// With one split the block folds the sink in and writes the output; with
// several it writes (O, max, sum) partials that attention_merge_f32_sm90
// combines. The sink enters the denominator only, as in the reference.
#include <algorithm>
#include <cfloat>

#include "backend/cuda/kernels/attention/attention.h"
#include "backend/cuda/kernels/common/decode.cuh"
#include "backend/cuda/kernels/rope/rope.h"
#include "backend/cuda/kernels/rope/rope_pairs.cuh"
#include "backend/cuda/kernels/gemm/mma_bf16.cuh"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/pdl.h"
#include "backend/cuda/runtime/smem_limit.h"
#include "backend/cuda/runtime/device_info.h"
#include "backend/cuda/runtime/env_switch.h"

namespace aff::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kFewQueries = 16;  // up to this many queries (decode), blocks take 16 heads, else 64
constexpr int kKeys = 32;  // keys per tile
constexpr int kPad = 8;    // bf16 row padding: consecutive rows start 4 banks apart
constexpr int kSLd = kKeys + 1;
constexpr int kPLd = kKeys + kPad;
constexpr int kMaxDh = 512;
constexpr int kMergeThreads = 128;
constexpr int64_t kMaxSplits = 64;  // the merge reads every split's partials
// Default cap on the key splits (AFF_CUDA_ATTN_SPLITS overrides it up to
// kMaxSplits). With the default --kv-size (1M) the capacity asks for 64; at
// 4K / 32K / 256K context 64 splits measured 5.81 / 6.23 / 10.03 ms/token,
// 32 splits 5.77 / 6.16 / 9.88, 20 splits 5.73 / 6.11 / 9.95
// (docs/BENCHMARKS.md): the fixed cost of a split (its block, its partials,
// the merge's share) outweighs the parallelism at those lengths.
constexpr int64_t kDefaultSplits = 32;

// Shared-memory layout for head_dim padded to 64 * NT and 16 * MT head rows;
// kParts = 2 holds hi and lo; KS score buffers (partial sums over halves of
// the head dim when one m-tile leaves warps to spare).
template <int NT, bool kSplit, int MT>
struct Layout {
  static constexpr int DP = 64 * NT;
  static constexpr int LD = DP + kPad;
  static constexpr int R = 16 * MT;
  static constexpr int KS = MT == 1 ? 2 : 1;
  static constexpr int kParts = kSplit ? 2 : 1;
  static constexpr size_t q = 0;                                        // u16 [parts][R][LD]
  static constexpr size_t k = q + size_t(kParts) * R * LD * 2;          // u16 [parts][kKeys][LD]
  static constexpr size_t s = k + size_t(kParts) * kKeys * LD * 2;      // f32 [KS][R][kSLd]
  static constexpr size_t p = s + size_t(KS) * R * kSLd * 4;  // u16 [parts][R][kPLd]
  static constexpr size_t rows = p + size_t(kParts) * R * kPLd * 2;     // f32 m, l, corr [R] each
  static constexpr size_t keys = rows + 3 * R * 4;                      // const float* [2][kKeys]
  static constexpr size_t bytes = keys + 2 * kKeys * sizeof(const float*);
};

__host__ __device__ constexpr int batch_of(int n) { return n % 16 == 0 ? 16 : n % 8 == 0 ? 8 : n % 4 == 0 ? 4 : n % 2 == 0 ? 2 : 1; }

// The keys of query t: window positions [win_start, pos], then compressed ones.
struct KeySet {
  int64_t pos0, win_start, n_win, n_keys;
};

// sel_n: the query's selected count (kSelected), loaded by the caller early.
__device__ __forceinline__ KeySet key_set(const AttentionArgs& a, int64_t pos0, int64_t t, int64_t sel_n) {
  KeySet k;
  const int64_t pos = pos0 + t;
  k.pos0 = pos0;
  k.win_start = pos - a.W + 1 > 0 ? pos - a.W + 1 : 0;
  k.n_win = pos - k.win_start + 1;
  int64_t n_comp = 0;
  if (a.mode == AttnEntries::kVisible) {
    n_comp = visible_entries(pos, a.ratio, a.entry_capacity);
  } else if (a.mode == AttnEntries::kSelected) {
    n_comp = sel_n;
  }
  k.n_keys = k.n_win + n_comp;
  return k;
}

__device__ __forceinline__ const float* key_ptr(const AttentionArgs& a, const KeySet& k, int64_t t, int64_t i) {
  if (i < k.n_win) {
    const int64_t p = k.win_start + i;
    return p >= k.pos0 ? a.kv + (p - k.pos0) * a.Dh : a.ring + (p % a.W) * a.Dh;
  }
  int64_t j = i - k.n_win;
  if (a.mode == AttnEntries::kSelected) j = a.sel[t * a.sel_ld + j];
  return a.entries + j * a.Dh;
}

// Partial results of split s: O at scratch[((t*splits + s)*H + h)*Dh], then
// (max, sum) pairs after all O rows.
__device__ __forceinline__ float* partial_o(const AttentionArgs& a, int splits, int64_t t, int s, int h) {
  return a.scratch + ((t * splits + s) * a.H + h) * a.Dh;
}
__device__ __forceinline__ float* partial_ml(const AttentionArgs& a, int splits, int64_t t, int s, int h) {
  return a.scratch + a.T * splits * a.H * a.Dh + ((t * splits + s) * a.H + h) * 2;
}

// q_finish in registers: v[i] holds channels [4 d_i, 4 d_i + 4) of staged row
// i * (kThreads / kTpr) + threadIdx.x / kTpr (the Q loop's map). Each row is
// RMS-normalised (sums per warp, added in warp order: the same on every
// replay) and its rope tail rotated at position pos, with qkv_finish's table
// and rotation (rope_pairs.cuh). scratch: >= kIters * 8 + rope_dim floats of
// shared memory, 16-byte aligned. Every thread of the block must call it.
template <int kIters, int kTpr>
__device__ __forceinline__ void finish_q_rows(float4 (&v)[kIters], const AttentionArgs& a, int64_t pos,
                                              float* scratch) {
  constexpr int kWarps = kThreads / 32, kWarpsRow = kTpr / 32;
  float* part = scratch;                                            // [kIters][kWarps]
  float2* tab = reinterpret_cast<float2*>(scratch + kIters * kWarps);  // [rope_dim / 2] (cos, sin)
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < kIters; ++i) {
    float ss = v[i].x * v[i].x;
    ss = fmaf(v[i].y, v[i].y, ss);
    ss = fmaf(v[i].z, v[i].z, ss);
    ss = fmaf(v[i].w, v[i].w, ss);
    ss = warp_sum(ss);
    if (lane == 0) part[i * kWarps + warp] = ss;
  }
  rope_table_fill(tab, pos, a.unrope_freq, a.rope_dim / 2, threadIdx.x, kThreads);
  __syncthreads();
  const int w0 = int(threadIdx.x) / kTpr * kWarpsRow, d = 4 * (int(threadIdx.x) % kTpr), off = a.Dh - a.rope_dim;
#pragma unroll
  for (int i = 0; i < kIters; ++i) {
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < kWarpsRow; ++j) ss += part[i * kWarps + w0 + j];
    const float scale = rms_inv(ss, float(a.Dh), a.q_eps);
    v[i] = make_float4(v[i].x * scale, v[i].y * scale, v[i].z * scale, v[i].w * scale);
    if (d >= off && d < a.Dh) v[i] = rope_rotate4(v[i], reinterpret_cast<const float4*>(tab)[(d - off) / 4]);
  }
}

template <int NT, bool kSplit, int MT>
__global__ void __launch_bounds__(kThreads, 1) attention_mma_sm90(AttentionArgs a, int splits, int keys_per_split) {
  pdl_start();  // runtime/pdl.h: nothing in this kernel runs before the wait
  using L = Layout<NT, kSplit, MT>;
  constexpr int DP = L::DP, LD = L::LD, kRows = L::R, KS = L::KS;
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t* q_s = reinterpret_cast<uint16_t*>(smem + L::q);
  uint16_t* k_s = reinterpret_cast<uint16_t*>(smem + L::k);
  float* s_s = reinterpret_cast<float*>(smem + L::s);
  uint16_t* p_s = reinterpret_cast<uint16_t*>(smem + L::p);
  float* row_m = reinterpret_cast<float*>(smem + L::rows);
  float* row_l = row_m + kRows;
  float* row_c = row_l + kRows;
  const float** key_s = reinterpret_cast<const float**>(smem + L::keys);

  const int split = blockIdx.x;
  const int64_t t = blockIdx.y;
  const int h0 = blockIdx.z * kRows;
  const int n_heads = a.H - h0 < kRows ? a.H - h0 : kRows;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3;
  // The step, the selected count and Q do not depend on each other: their
  // loads are all issued before any is waited on (decode is latency bound).
  const StepInfo step = *a.step;
  const int64_t sel_n = a.mode == AttnEntries::kSelected ? a.sel_count[t] : 0;
  {  // Q (rows of query t < a.T, valid whatever the step): batched loads
    constexpr int kIters = kRows * DP / 4 / kThreads, kBatch = batch_of(kIters);
#pragma unroll
    for (int b = 0; b < kIters; b += kBatch) {
      float4 v[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const int idx = threadIdx.x + (b + i) * kThreads, r = idx / (DP / 4), d = 4 * (idx % (DP / 4));
        v[i] = r < n_heads && d < a.Dh ? __ldg(reinterpret_cast<const float4*>(a.q + ((t * a.H + h0 + r) * a.Dh + d)))
                                       : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
      // q_finish: the whole block holds every row here (one batch), whole
      // warps per row; the score buffer is free until the first key tile.
      constexpr int kTpr = DP / 4;  // threads per head row
      if constexpr (kBatch == kIters && kTpr >= 32 && kThreads % kTpr == 0) {
        if (a.q_finish) finish_q_rows<kBatch, kTpr>(v, a, step.pos0 + t, s_s);
      }
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const int idx = threadIdx.x + (b + i) * kThreads, r = idx / (DP / 4), d = 4 * (idx % (DP / 4));
        store4_bf16<kSplit>(q_s + r * LD + d, q_s + kRows * LD + r * LD + d, v[i]);
      }
    }
  }
  if (t >= step.T) return;
  const KeySet ks = key_set(a, step.pos0, t, sel_n);
  // Key tiles are dealt to the splits by this query's key count: the split
  // count comes from the capacities (fixed for a captured step), and dealing
  // by capacity would leave a short context's keys on the first few splits
  // (with --kv-size 1M a 4K context's 160 HCA keys all on split 0 of 64).
  const int64_t per = splits > 1 ? ((ks.n_keys + kKeys - 1) / kKeys + splits - 1) / splits * kKeys : keys_per_split;
  const int64_t k_begin = int64_t(split) * per;
  const int64_t k_end = ks.n_keys < k_begin + per ? ks.n_keys : k_begin + per;

  if (k_begin >= k_end) {  // a split past this query's keys (only when splits > 1)
    if (threadIdx.x < n_heads) {
      float* ml = partial_ml(a, splits, t, split, h0 + threadIdx.x);
      ml[0] = -INFINITY;
      ml[1] = 0.0f;
    }
    return;
  }

  if (threadIdx.x < kRows) {
    row_m[threadIdx.x] = -INFINITY;
    row_l[threadIdx.x] = 0.0f;
  }

  float o[MT][NT][4];
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mi][nt][e] = 0.0f;

  // Key tiles are software-pipelined: tile i+1's f32 values are loaded into
  // registers while tile i is multiplied, so global latency overlaps the MMAs.
  constexpr int kKIters = kKeys * DP / 4 / kThreads;
  float4 kreg[kKIters];
  auto tile_ptrs = [&](int64_t kt0, const float** dst) {
    if (warp == 0) {
      const int64_t i = kt0 + lane;
      dst[lane] = i < k_end ? key_ptr(a, ks, t, i) : nullptr;
    }
  };
  auto load_tile = [&](const float* const* ptrs) {
#pragma unroll
    for (int i = 0; i < kKIters; ++i) {
      const int idx = threadIdx.x + i * kThreads, r = idx / (DP / 4), d = 4 * (idx % (DP / 4));
      const float* kp = ptrs[r];
      kreg[i] = kp != nullptr && d < a.Dh ? __ldg(reinterpret_cast<const float4*>(kp + d))
                                          : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  };
  tile_ptrs(k_begin, key_s);
  __syncthreads();
  load_tile(key_s);

  int buf = 0;
  for (int64_t kt0 = k_begin; kt0 < k_end; kt0 += kKeys, buf ^= 1) {
    const int nk = k_end - kt0 < kKeys ? int(k_end - kt0) : kKeys;
#pragma unroll
    for (int i = 0; i < kKIters; ++i) {
      const int idx = threadIdx.x + i * kThreads, r = idx / (DP / 4), d = 4 * (idx % (DP / 4));
      store4_bf16<kSplit>(k_s + r * LD + d, k_s + kKeys * LD + r * LD + d, kreg[i]);
    }
    const bool more = kt0 + kKeys < k_end;
    if (more) tile_ptrs(kt0 + kKeys, key_s + (buf ^ 1) * kKeys);
    __syncthreads();
    if (more) load_tile(key_s + (buf ^ 1) * kKeys);

    {  // S = Q K^T * scale: warp = one m-tile x kNt key n-tiles over 1/KS of the head dim
      constexpr int kNt = 4 * MT * KS / 8;
      const int mi = warp % MT, slot = warp / MT;
      const int kp = KS == 2 ? slot / 4 : 0, nt0 = KS == 2 ? slot % 4 : slot * kNt;
      float acc[kNt][4];
#pragma unroll
      for (int j = 0; j < kNt; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
#pragma unroll 4
      for (int k0 = kp * (DP / KS); k0 < (kp + 1) * (DP / KS); k0 += 16) {
        uint32_t ah[4];
        load_a_frag(ah, q_s, LD, 16 * mi, k0, lane);
        uint32_t al[4];
        if (kSplit) load_a_frag(al, q_s + kRows * LD, LD, 16 * mi, k0, lane);
#pragma unroll
        for (int j = 0; j < kNt; ++j) {
          uint32_t b0, b1;
          load_b_frag_nk(b0, b1, k_s, LD, 8 * (nt0 + j), k0, lane);
          mma_bf16_16816(acc[j], ah, b0, b1);
          if (kSplit) {
            mma_bf16_16816(acc[j], al, b0, b1);
            load_b_frag_nk(b0, b1, k_s + kKeys * LD, LD, 8 * (nt0 + j), k0, lane);
            mma_bf16_16816(acc[j], ah, b0, b1);
          }
        }
      }
      float* s_part = s_s + kp * kRows * kSLd;
#pragma unroll
      for (int j = 0; j < kNt; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = 16 * mi + g + (e >= 2 ? 8 : 0), col = 8 * (nt0 + j) + 2 * c + (e & 1);
          s_part[row * kSLd + col] = col < nk ? acc[j][e] * a.scale : -INFINITY;
        }
    }
    __syncthreads();

    // Online softmax: warp = 8 head rows, lane = key.
#pragma unroll
    for (int rr = 0; rr < kRows / 8; ++rr) {
      const int r = (kRows / 8) * warp + rr;
      const float s = KS == 2 ? s_s[r * kSLd + lane] + s_s[(kRows + r) * kSLd + lane] : s_s[r * kSLd + lane];
      const float m_old = row_m[r];
      const float m_new = fmaxf(m_old, warp_max(s));
      const float p = expf(s - m_new);
      const float sum = warp_sum(p);
      uint16_t ph, pl;
      split_bf16(p, ph, pl);
      p_s[r * kPLd + lane] = ph;
      if (kSplit) p_s[kRows * kPLd + r * kPLd + lane] = pl;
      if (lane == 0) {
        const float corr = expf(m_old - m_new);
        row_m[r] = m_new;
        row_l[r] = row_l[r] * corr + sum;
        row_c[r] = corr;
      }
    }
    __syncthreads();

    // O = O * corr + P K: warp = all head rows x channels [8 NT warp, +8 NT).
#pragma unroll
    for (int mi = 0; mi < MT; ++mi) {
      const float c_lo = row_c[16 * mi + g], c_hi = row_c[16 * mi + g + 8];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        o[mi][nt][0] *= c_lo, o[mi][nt][1] *= c_lo;
        o[mi][nt][2] *= c_hi, o[mi][nt][3] *= c_hi;
      }
    }
#pragma unroll
    for (int kk = 0; kk < kKeys; kk += 16) {
      uint32_t pa[MT][4], pl[MT][4];
#pragma unroll
      for (int mi = 0; mi < MT; ++mi) {
        load_a_frag(pa[mi], p_s, kPLd, 16 * mi, kk, lane);
        if (kSplit) load_a_frag(pl[mi], p_s + kRows * kPLd, kPLd, 16 * mi, kk, lane);
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int col = warp * NT * 8 + nt * 8;
        uint32_t b0, b1;
        ldmatrix_x2_trans(b0, b1, k_s + (kk + (lane & 15)) * LD + col);
#pragma unroll
        for (int mi = 0; mi < MT; ++mi) {
          mma_bf16_16816(o[mi][nt], pa[mi], b0, b1);
          if (kSplit) mma_bf16_16816(o[mi][nt], pl[mi], b0, b1);
        }
        if (kSplit) {
          ldmatrix_x2_trans(b0, b1, k_s + kKeys * LD + (kk + (lane & 15)) * LD + col);
#pragma unroll
          for (int mi = 0; mi < MT; ++mi) mma_bf16_16816(o[mi][nt], pa[mi], b0, b1);
        }
      }
    }
    __syncthreads();  // the next tile rewrites key_s, k_s, s_s and p_s
  }

#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = 16 * mi + g + 8 * half;
      if (r >= n_heads) continue;
      const int h = h0 + r;
      float f = 1.0f;
      float* dst;
      if (splits == 1) {
        const float sink = a.sinks[h], m = row_m[r];
        const float big = fmaxf(m, sink);
        const float e = expf(m - big);
        f = e / (row_l[r] * e + expf(sink - big));
        dst = a.out + (t * a.H + h) * a.Dh;
      } else {
        dst = partial_o(a, splits, t, split, h);
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int d = warp * NT * 8 + nt * 8 + 2 * c;
        if (d < a.Dh) *reinterpret_cast<float2*>(dst + d) = make_float2(o[mi][nt][2 * half] * f, o[mi][nt][2 * half + 1] * f);
      }
    }
  if (splits > 1 && threadIdx.x < n_heads) {
    float* ml = partial_ml(a, splits, t, split, h0 + threadIdx.x);
    ml[0] = row_m[threadIdx.x];
    ml[1] = row_l[threadIdx.x];
  }
}

// out[t, h] = sum_s O_s e^(m_s - M) / (e^(sink - M) + sum_s l_s e^(m_s - M)).
// Block per (query, head): the split weights are computed once into shared
// memory; each thread then owns 4 channels and sums the splits with several
// loads in flight (the merge is latency bound, not bandwidth bound).
__global__ void __launch_bounds__(kMergeThreads) attention_merge_f32_sm90(AttentionArgs a, int splits) {
  pdl_start();  // runtime/pdl.h: nothing in this kernel runs before the wait
  __shared__ float wt[kMaxSplits];
  __shared__ float s_inv;
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y;
  const int64_t T_now = a.step->T;  // checked after the partials' loads are issued
  const int lane = threadIdx.x & 31;
  if (threadIdx.x < 32) {  // warp 0: splits lane, lane + 32
    const float sink = a.sinks[h];
    float m[2], l[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int s = lane + 32 * i;
      const float* ml = s < splits ? partial_ml(a, splits, t, s, h) : nullptr;
      m[i] = ml != nullptr ? ml[0] : -INFINITY;
      l[i] = ml != nullptr ? ml[1] : 0.0f;
      if (!(l[i] > 0.0f)) m[i] = -INFINITY;  // an empty split (its O was never written)
    }
    const float big = fmaxf(sink, warp_max(fmaxf(m[0], m[1])));
    float den = 0.0f;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float e = l[i] > 0.0f ? expf(m[i] - big) : 0.0f;
      if (lane + 32 * i < kMaxSplits) wt[lane + 32 * i] = e;
      den += l[i] * e;
    }
    den = warp_sum(den) + expf(sink - big);
    if (lane == 0) s_inv = 1.0f / den;
  }
  if (t >= T_now) return;  // uniform over the block
  __syncthreads();
  const float inv = s_inv;
  constexpr int kUnroll = 8;
  for (int d = 4 * threadIdx.x; d < a.Dh; d += 4 * kMergeThreads) {
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int s0 = 0; s0 < splits; s0 += kUnroll) {
      float4 v[kUnroll];
#pragma unroll
      for (int i = 0; i < kUnroll; ++i)
        v[i] = s0 + i < splits && wt[s0 + i] != 0.0f
                   ? *reinterpret_cast<const float4*>(partial_o(a, splits, t, s0 + i, h) + d)
                   : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int i = 0; i < kUnroll; ++i) {
        const float w = s0 + i < splits ? wt[s0 + i] : 0.0f;
        acc.x = fmaf(v[i].x, w, acc.x), acc.y = fmaf(v[i].y, w, acc.y);
        acc.z = fmaf(v[i].z, w, acc.z), acc.w = fmaf(v[i].w, w, acc.w);
      }
    }
    float4 o = make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
    const int r0 = d - (a.Dh - a.rope_dim);  // channel in the rope tail (pairs (r0, r0 + 1), (r0 + 2, r0 + 3))
    if (a.unrope_freq != nullptr && r0 >= 0) {  // rope_f32's arithmetic with inverse = true
      const float pos = float(a.step->pos0 + t);
      float s0, c0, s1, c1;
      sincosf(pos * a.unrope_freq[r0 / 2], &s0, &c0);
      sincosf(pos * a.unrope_freq[r0 / 2 + 1], &s1, &c1);
      s0 = -s0, s1 = -s1;
      o = make_float4(o.x * c0 - o.y * s0, o.y * c0 + o.x * s0, o.z * c1 - o.w * s1, o.w * c1 + o.z * s1);
    }
    *reinterpret_cast<float4*>(a.out + (t * a.H + h) * a.Dh + d) = o;
  }
}


struct SplitPlan {
  int splits = 1;
  int keys_per_split = 0;
};

// Splits keys only when queries x head groups leave SMs idle; never depends
// on the position (only on capacities and entry_bound), so a captured step
// keeps its grid.
SplitPlan plan_splits(const AttentionArgs& a) {
  const int64_t visible = a.entry_bound > 0 ? std::min(a.entry_bound, a.entry_capacity) : a.entry_capacity;
  const int64_t max_comp = a.mode == AttnEntries::kVisible ? visible
                           : a.mode == AttnEntries::kSelected ? a.sel_ld
                                                              : 0;
  const int64_t tiles = (a.W + max_comp + kKeys - 1) / kKeys;
  const int64_t rows = a.T <= kFewQueries ? 16 : 64;
  const int64_t groups = (a.H + rows - 1) / rows;
  const int64_t base = std::max<int64_t>(1, a.T * groups);
  // AFF_CUDA_ATTN_SPLITS: a cap on the key splits (tuning knob).
  static const int cap = env_int("AFF_CUDA_ATTN_SPLITS", int(kDefaultSplits), 1, int(kMaxSplits));
  int64_t splits = std::min<int64_t>({tiles, (2 * current_device_multiprocessors() + base - 1) / base, int64_t(cap)});
  const int64_t per_split_floats = a.T * a.H * (int64_t(a.Dh) + 2);
  if (a.scratch == nullptr || per_split_floats == 0) splits = 1;
  else splits = std::min<int64_t>(splits, a.scratch_floats / per_split_floats);
  SplitPlan p;
  if (splits <= 1) {  // one split reads keys_per_split keys: as many as the capacity allows
    const int64_t cap_comp = a.mode == AttnEntries::kVisible ? a.entry_capacity : max_comp;
    p.keys_per_split = int(std::min<int64_t>((a.W + cap_comp + kKeys - 1) / kKeys * kKeys, INT32_MAX / 2));
    return p;
  }
  const int64_t tiles_per = (tiles + splits - 1) / splits;
  p.splits = int((tiles + tiles_per - 1) / tiles_per);
  p.keys_per_split = int(tiles_per * kKeys);
  return p;
}

template <int NT, bool kSplit, int MT>
SmemLimit smem_of() {
  return {reinterpret_cast<const void*>(attention_mma_sm90<NT, kSplit, MT>), int(Layout<NT, kSplit, MT>::bytes)};
}

// The head-dim variants of one (kSplit, MT).
template <bool kSplit, int MT>
Status allow_smem_nt() {
  return raise_smem_limits({smem_of<1, kSplit, MT>(), smem_of<2, kSplit, MT>(), smem_of<3, kSplit, MT>(),
                            smem_of<4, kSplit, MT>(), smem_of<8, kSplit, MT>()});
}

// Every variant's shared-memory limit is raised on the first call (an eager
// prefill), never inside a captured decode step.
Status allow_smem_all() {
  AFF_RETURN_IF_ERROR((allow_smem_nt<true, 1>()));
  AFF_RETURN_IF_ERROR((allow_smem_nt<true, 4>()));
  AFF_RETURN_IF_ERROR((allow_smem_nt<false, 1>()));
  return allow_smem_nt<false, 4>();
}

template <int NT, bool kSplit, int MT>
Status launch(const AttentionArgs& a, const SplitPlan& p, cudaStream_t stream) {
  using L = Layout<NT, kSplit, MT>;
  const dim3 grid(unsigned(p.splits), unsigned(a.T), unsigned((a.H + L::R - 1) / L::R));
  const cudaError_t e = launch_pdl(attention_mma_sm90<NT, kSplit, MT>, grid, dim3(kThreads), L::bytes, stream, a,
                                     p.splits, p.keys_per_split);
  return cuda_status(e, "attention_mma_sm90");
}

template <bool kSplit, int MT>
Status launch_nt(const AttentionArgs& a, const SplitPlan& p, cudaStream_t stream) {
  switch ((a.Dh + 63) / 64) {
    case 1: return launch<1, kSplit, MT>(a, p, stream);
    case 2: return launch<2, kSplit, MT>(a, p, stream);
    case 3: return launch<3, kSplit, MT>(a, p, stream);
    case 4: return launch<4, kSplit, MT>(a, p, stream);
    default: return launch<8, kSplit, MT>(a, p, stream);
  }
}

}  // namespace

int attention_splits(const AttentionArgs& a) { return plan_splits(a).splits; }

bool attention_finishes_q(const AttentionArgs& a) {
  const int nt = (a.Dh + 63) / 64;  // launch_nt's choice: 3 would leave a row across part of a warp
  const bool whole_warps = nt == 2 || nt == 4 || (nt > 4 && nt <= 8);
  return a.T >= 1 && a.T <= kFewQueries && whole_warps && a.unrope_freq != nullptr && a.rope_dim > 0 &&
         a.rope_dim % 4 == 0 && a.rope_dim <= a.Dh && a.Dh % 4 == 0;
}

Status attention_sparse(const AttentionArgs& a, cudaStream_t stream) {
  if (a.T == 0) return Status::ok();
  if (a.step == nullptr) return internal_error("attention: no step info");
  if (a.Dh <= 0 || a.Dh > kMaxDh || a.Dh % 8 != 0)
    return unsupported("attention: head_dim must be a multiple of 8 and at most 512 on the GPU");
  if (a.H <= 0 || a.W <= 0) return internal_error("attention: no heads or no window");
  if (a.T > 65535) return internal_error("attention: too many queries in one launch");
  if (a.mode == AttnEntries::kVisible && (a.entries == nullptr || a.ratio <= 0))
    return internal_error("attention: compressed entries missing");
  if (a.mode == AttnEntries::kSelected && (a.entries == nullptr || a.sel == nullptr || a.sel_count == nullptr))
    return internal_error("attention: selected entries missing");
  if (a.q_finish && !attention_finishes_q(a)) return internal_error("attention: q_finish with unsupported arguments");
  static const Status smem_ok = allow_smem_all();
  AFF_RETURN_IF_ERROR(smem_ok);
  const SplitPlan p = plan_splits(a);
  const bool few = a.T <= kFewQueries, split = a.precision == MmaPrecision::kBf16x3;
  AFF_RETURN_IF_ERROR(split ? (few ? launch_nt<true, 1>(a, p, stream) : launch_nt<true, 4>(a, p, stream))
                            : (few ? launch_nt<false, 1>(a, p, stream) : launch_nt<false, 4>(a, p, stream)));
  // The merge rotates whole float4s of the rope tail; other tails (and
  // unsplit launches) take rope_f32 afterwards.
  AttentionArgs m = a;
  const bool merge_unrope = a.unrope_freq != nullptr && p.splits > 1 && a.rope_dim % 4 == 0 && a.rope_dim <= a.Dh;
  if (!merge_unrope) m.unrope_freq = nullptr;
  if (p.splits > 1) {
    const cudaError_t e = launch_pdl(attention_merge_f32_sm90, dim3(unsigned(a.T), unsigned(a.H)),
                                     dim3(kMergeThreads), 0, stream, m, p.splits);
    AFF_RETURN_IF_ERROR(cuda_status(e, "attention_merge_f32_sm90"));
  }
  if (a.unrope_freq == nullptr || merge_unrope) return Status::ok();
  RopeArgs r;
  r.x = a.out, r.rows = a.T * a.H, r.stride = a.Dh, r.offset = a.Dh - a.rope_dim;
  r.inv_freq = a.unrope_freq, r.half = a.rope_dim / 2, r.rows_per_pos = a.H, r.step = a.step, r.inverse = true;
  return rope_f32(r, stream);
}

}  // namespace aff::cuda
