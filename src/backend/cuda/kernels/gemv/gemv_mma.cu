// gemv_mma_sm90: decode GEMV (T <= 8 tokens) on tensor cores for FP8 E4M3
// weights with 128x128 block scales, for Q8_0 weights split into codes and
// scales (DevFormat::kQ8) and for BF16 weights.
//
// Why tensor cores for a GEMV: at batch 1 the f32 path issues one FMA and a
// decode per weight and tops out far below HBM bandwidth (instruction bound).
// Here a warp multiplies a 16-row weight tile against up to 8 tokens with
// mma.sync m16n8k16 (f16 in, f32 accumulate): per 16 weight bytes a lane
// issues 8 hardware E4M3x2 -> f16x2 conversions (exact: every E4M3 value is an
// f16) and two MMAs cover 512 multiply-adds. The tokens are the MMA's N
// columns, so T = 2..8 (speculative drafts) costs the same weight read as T = 1.
//
// A dot product does not care about the order of its terms, so the K order
// inside an MMA is free: lane (g, c) (g = lane / 4, c = lane % 4) loads the 16
// consecutive bytes [16c, 16c + 16) of a 64-column step from rows g and g + 8,
// and MMA j of the step takes bytes [4j, 4j + 4) of them as its logical
// columns {2c, 2c+1, 2c+8, 2c+9}. The activation fragment follows the same
// map, so it too is 16 consecutive f16 per lane (two 16-byte shared loads).
//
// Activations are staged in shared memory as f16 per 128-column block scaled
// by a power of two (the block's max lands in [2^13, 2^14): no overflow, no
// rounding from the scaling). Exact setting: x = hi + lo (two f16), ~2^-22
// relative, the f32 reference to rounding. Fast setting: hi alone, ~2^-12
// relative per element. Each 128-column block's MMA sums are multiplied by
// (weight block scale) x (x block scale) and added in f32. Exact with up to 4
// tokens (decode, short drafts), hi and lo are two columns of one MMA (token
// t's in columns 2t, 2t + 1), so a fragment costs one MMA, not two: the MMA
// pipe was a quarter of a 32 MB GEMV's time at batch 1, where 7 of the 8
// columns went unused. The sums and their order are the same either way.
//
// kQ8 weights take the FP8 path with int8 codes made f16 by bit placement
// (exact) and one scale per row and 32 columns. Lane c's 16 bytes of a
// 64-column step hold columns [8c, 8c + 8) and [32 + 8c, 40 + 8c) (the upload
// places them so, q8_code_at), so MMAs 0, 1 cover the first scale group and
// 2, 3 the second, and x is read with the same map. Each group's MMA sums are
// multiplied by their rows' scales, and a column block's sum by x's 2^e, in f32.
//
// BF16 weights take the same path with bf16 MMAs on the stored bits: a
// "column block" is then 64 columns (the same 128 bytes per row), lane c's 16
// bytes are 8 columns, and MMA j takes its words 2j, 2j+1. x is split into
// bf16 hi + mid (+ lo in the exact setting: ~2^-24, the f32 reference to
// rounding; hi + mid alone, ~2^-16, in the fast one), no scaling needed.
//
// Work: a block of S x RT warps covers RT 16-row tiles; the S warps of a tile
// split its 128-column blocks (split-K) and are summed in shared memory in a
// fixed order (deterministic). Each lane keeps kDepth column blocks (3 x 64
// bytes) of loads in flight; the first are issued before x is staged, so the
// staging hides under the first weight reads. Rows of consecutive groups of
// rows_per_group may read their own slice of x (the attention's grouped
// output projection in one launch): grid.y walks the groups. Launched as a
// programmatic dependent (runtime/pdl.h): the first weight loads are issued
// before waiting for the kernel that produces x.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdlib>

#include "backend/cuda/kernels/common/decode.cuh"
#include "backend/cuda/kernels/gemm/mma_bf16.cuh"
#include "backend/cuda/kernels/gemm/mma_precision.h"
#include "backend/cuda/kernels/gemv/gemv.h"
#include "backend/cuda/kernels/mhc/mhc.h"
#include "backend/cuda/kernels/mhc/mhc_coeffs.cuh"
#include "backend/cuda/kernels/moe/swiglu.cuh"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/device_info.h"
#include "backend/cuda/runtime/env_switch.h"
#include "backend/cuda/runtime/pdl.h"
#include "backend/cuda/runtime/smem_limit.h"

namespace aff::cuda {
namespace {

constexpr int kTile = 16;          // weight rows per warp tile (the MMA's M)
int64_t round_up16(int64_t n) { return (n + kTile - 1) / kTile * kTile; }
constexpr int kMaxTok = 8;         // tokens per launch (the MMA's N)
constexpr int kMaxWarps = 16;
constexpr int kPad = 8;            // 16-bit values after each staged token row: rows start 16 bytes apart mod 128
constexpr int64_t kMaxStageBytes = 100 * 1024;  // two blocks per SM; four BF16 tokens of 4096 columns (exact)

struct MmaArgs {
  DeviceLinear w;
  int64_t row_begin, n_rows;       // rows [row_begin, row_begin + n_rows) of w
  const float* x;                  // token t, group 0: x + t * ldx; group g adds g * x_group_stride
  int64_t ldx, T;
  int64_t rows_per_group, x_group_stride;
  float* y;                        // token t: y + t * ldy, row r at (r - row_begin)
  int64_t ldy;
  int split, tiles_per_block;
  // Stacked pair (rows1 > 0, row_begin 0, one group): rows [rows1, n_rows) are
  // rows [0, n_rows - rows1) of w2 (same format, width and block), written to
  // y2 (stride ldy2). Two projections of one x then share a launch.
  int64_t rows1;
  DeviceLinear w2;
  float* y2;
  int64_t ldy2;
  // Non-null: x's token rows are RMS-normalised with this weight [K] first
  // (the query path's q_norm folded into wq_b: one launch fewer per layer).
  const float* x_norm;
  float eps;
  // A deferred mHC comb (mhc.h) finished by one extra block, the last of the
  // grid (one row group): it runs beside the projection, off the step's path.
  HcCombJob job;
  // Non-null: run only when (run_step->pos0 + 1) % run_ratio == 0 (PairOptions).
  const StepInfo* run_step;
  int run_ratio;
  int64_t grp0;                    // row_begin / rows_per_group (the host divides: 64-bit division is a call here)
  bool x_vec;                      // x, ldx and x_group_stride allow 16-byte loads
  // Non-null: x is an expert's gate rows and x_up its up rows (same strides);
  // the GEMV reads swiglu_clamp(x, x_up, swiglu_limit) (a dense down projection).
  const float* x_up;
  float swiglu_limit;
};

__device__ __forceinline__ uint32_t bits(__half2 h) { return *reinterpret_cast<const uint32_t*>(&h); }

__device__ __forceinline__ uint32_t word(const uint4& v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

// Two int8 codes (bytes 0, 1 of v, or 2, 3 with kHigh) as an f16x2: each
// offset byte u = code + 128 is placed under the exponent of 1024, giving
// 1024 + u exactly, and 1152 is taken off (exact: integers below 2048).
template <bool kHigh>
__device__ __forceinline__ uint32_t i8x2_to_f16x2(uint32_t v) {
  const uint32_t u = __byte_perm(v ^ 0x80808080u, 0x64646464u, kHigh ? 0x7362u : 0x5140u);
  const __half2 r = __hsub2(*reinterpret_cast<const __half2*>(&u), __half2(__ushort_as_half(0x6480), __ushort_as_half(0x6480)));
  return bits(r);
}

// kQ8: one row's 4 scales of a column block (8 bytes). Through L1, unlike
// the codes: a 32-byte sector holds 4 column blocks' scales, so the next 3
// loads of the row hit L1 instead of fetching the sector from L2 again.
__device__ __forceinline__ uint2 ld_scales8(const uint8_t* p) { return __ldg(reinterpret_cast<const uint2*>(p)); }

// One lane's share of a 128-byte column block of rows a and b: buf[0], buf[1]
// the first 64-column step of a and b, buf[2], buf[3] the second.
__device__ __forceinline__ void load_block(const uint8_t* a, const uint8_t* b, uint4 (&buf)[4]) {
  buf[0] = ld_stream16(a);
  buf[1] = ld_stream16(b);
  buf[2] = ld_stream16(a + 64);
  buf[3] = ld_stream16(b + 64);
}

// kDepth: column blocks (128 bytes per row) of weight loads in flight per
// lane (16 registers each). Measured on the H200 (FP8): 3 at up to 128
// registers beat 2 at <= 85 registers with 1.5x the resident warps (8.29 vs
// 9.38 ms per decode token).
constexpr int kDepth = 3;

// Staged x for one weight kind: FP8 keeps f16 hi (+ lo) and a 2^e per 128
// columns; BF16 keeps bf16 hi, mid (+ lo).
template <bool kExact, bool kBf16>
struct Staging {
  static constexpr int kSplits = kBf16 ? (kExact ? 3 : 2) : (kExact ? 2 : 1);
  static constexpr int kCols = kBf16 ? 64 : 128;  // columns per 128-byte column block
};

// kSwiglu: x is read as swiglu_clamp(x, x_up) (a.x_up set); a variant of its
// own, as the branch alone cost the plain kernels ~1% of the decode step.
template <bool kExact, bool kBf16, bool kPacked, bool kQ8 = false, bool kSwiglu = false>
__global__ void __launch_bounds__(kMaxWarps * 32) gemv_mma_sm90(MmaArgs a) {
  static_assert(!kPacked || (kExact && !kBf16), "hi / lo columns are the exact FP8 form");
  static_assert(!(kQ8 && kBf16), "kQ8 takes the FP8 form's staging");
  using St = Staging<kExact, kBf16>;
  // MMAs per fragment: one per x split, or one for both (packed).
  constexpr int kMmaSplits = kPacked ? 1 : St::kSplits;
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ float red[kMaxWarps][4][32];
  if (a.job.comb != nullptr && blockIdx.x == gridDim.x - 1) {  // the job's block (launch_mma adds it)
    pdl_start();  // the comb logits are the previous kernel's output
    hc_comb_job_run(a.job);
    return;
  }
  if (a.run_step != nullptr) {  // a step that completes no block has nothing for this launch
    pdl_start();  // StepInfo is written before the step's first kernel; waiting keeps the chain's order simple
    if ((a.run_step->pos0 + 1) % a.run_ratio != 0) return;
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3;
  const int S = a.split, part = warp % S, sub = warp / S;
  const int64_t K = a.w.in, T = a.T;  // a stacked w2 has the same width
  // Index math that divides stays in 32 bits (K / 128 column blocks < 2^16).
  const int nkb = int(K) / St::kCols;
  const int64_t xrow = K + kPad;  // 16-bit values per staged token row

  // This block's group and tile.
  const int64_t grp = a.grp0 + blockIdx.y;
  const int64_t lo = max(a.row_begin, grp * a.rows_per_group);
  int64_t hi = min(a.row_begin + a.n_rows, (grp + 1) * a.rows_per_group);
  int64_t row0 = lo + (int64_t(blockIdx.x) * a.tiles_per_block + sub) * kTile;
  // The weight this warp's tile belongs to, its rows and its output.
  DeviceLinear w = a.w;
  float* y = a.y - a.row_begin;
  int64_t ldy = a.ldy;
  if (a.rows1 > 0) {
    if (row0 >= a.rows1) {
      w = a.w2, row0 -= a.rows1, hi = a.n_rows - a.rows1, y = a.y2, ldy = a.ldy2;
    } else {
      hi = a.rows1;
    }
  }
  const bool active = row0 < hi;  // warp-uniform
  const int kb_begin = nkb * part / S, kb_end = nkb * (part + 1) / S;

  // Issue the first weight loads before staging x (they do not depend on it).
  const int64_t rg = min(row0 + g, hi - 1), rg8 = min(row0 + g + 8, hi - 1);  // tail rows re-read the last
  const int64_t row_bytes = kBf16 ? 2 * K : K;
  const uint8_t* wg = w.weight + rg * row_bytes + c * 16;
  const uint8_t* wg8 = w.weight + rg8 * row_bytes + c * 16;
  // kQ8: the 4 f16 scales of a column block for rows rg and rg8 (8 bytes each,
  // 8-byte aligned: rows hold in / 32 scales, in % 128 == 0).
  const uint8_t* sg = kQ8 ? w.scale + rg * (K / 16) : nullptr;
  const uint8_t* sg8 = kQ8 ? w.scale + rg8 * (K / 16) : nullptr;
  uint2 sbuf[kDepth][2];
  // FP8 block scales travel with the weights: loaded at use, each would cost
  // a full memory latency per column block.
  const int64_t srow = kBf16 || kQ8 ? 0 : (min(row0, hi - 1) / 128) * w.scale_cols;  // FP8 blocks are 128 (gemv_mma_supports)
  uint4 buf[kDepth][4];
#pragma unroll
  for (int d = 0; d < kDepth; ++d) {
    const int kb = kb_begin + d;
    if (active && kb < kb_end) {
      load_block(wg + kb * 128, wg8 + kb * 128, buf[d]);
      if constexpr (kQ8) sbuf[d][0] = ld_scales8(sg + kb * 8), sbuf[d][1] = ld_scales8(sg8 + kb * 8);
    }
  }
  // The warp's FP8 block scales, decoded once into its own table: loaded and
  // decoded per column block they cost a branchy load and decode each, a
  // fifth of the loop's instructions. (Read after the staging's barrier.)
  uint16_t* xs = reinterpret_cast<uint16_t*>(smem);  // [kSplits][T][xrow]
  float* xinv = reinterpret_cast<float*>(smem + int64_t(St::kSplits) * T * xrow * 2);  // FP8: [T, K / 128]
  const int nch = int(K) / 128, nall = int(T) * nch;
  float* wtab = xinv + nall + warp * ((nkb + S - 1) / S);  // FP8: [warps][ceil(nkb / S)]
  if (!kBf16 && !kQ8 && active) {
    for (int i = lane; i < kb_end - kb_begin; i += 32) wtab[i] = decode_scale(w, load_scale_raw(w, srow + kb_begin + i));
  }

  // Launched as a programmatic dependent: everything above read only weights;
  // x is the previous kernel's output. The whole grid is resident, so the next
  // kernel may start its own prologue now.
  pdl_launch_dependents();
  pdl_wait();

  const float* xg = a.x + int64_t(blockIdx.y) * a.x_group_stride;
  const int nwarps = blockDim.x >> 5;
  // Folded rmsnorm: every block finds each token's 1 / rms itself (K floats
  // per token from L2; cheaper than a launch of its own).
  __shared__ float xscale[kMaxTok];
  if (a.x_norm != nullptr) {
    for (int64_t t = warp; t < T; t += nwarps) {
      const float* xr = xg + t * a.ldx;
      float ss = 0.0f;
      for (int64_t k = lane; k < K; k += 32) ss = fmaf(xr[k], xr[k], ss);
      ss = warp_sum(ss);
      if (lane == 0) xscale[t] = rms_inv(ss, float(K), a.eps);
    }
    __syncthreads();
  }

  // Stage x in chunks of 128 columns: FP8 as f16 scaled by 2^e per chunk, BF16 as bf16 splits.
  // Four chunks per warp per round, all loads issued before any is used.
  // Lane l holds a chunk's columns 4l .. 4l + 3: one 16-byte load where x
  // allows it, and one 8-byte store per staged plane.
  constexpr int kChunks = 4;
  for (int ch0 = warp; ch0 < nall; ch0 += nwarps * kChunks) {
    float v[kChunks][4];
#pragma unroll
    for (int q = 0; q < kChunks; ++q) {
      const int ch = ch0 + q * nwarps;
      if (ch >= nall) break;
      const int t = ch / nch;
      const int64_t off = t * a.ldx + (ch - t * nch) * 128 + 4 * lane;
      const float* src = xg + off;
      if (a.x_vec) {
        const float4 f = *reinterpret_cast<const float4*>(src);
        v[q][0] = f.x, v[q][1] = f.y, v[q][2] = f.z, v[q][3] = f.w;
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) v[q][i] = src[i];
      }
      if constexpr (kSwiglu) {
#pragma unroll
        for (int i = 0; i < 4; ++i) v[q][i] = swiglu_clamp(v[q][i], a.x_up[off + i], a.swiglu_limit);
      }
    }
#pragma unroll
    for (int q = 0; q < kChunks; ++q) {
      const int ch = ch0 + q * nwarps;
      if (ch >= nall) break;
      const int t = ch / nch, cc = ch - t * nch, k0 = cc * 128;
      if (a.x_norm != nullptr) {  // the rmsnorm kernel's arithmetic: weight * (x * inv)
#pragma unroll
        for (int i = 0; i < 4; ++i) v[q][i] = a.x_norm[k0 + 4 * lane + i] * (v[q][i] * xscale[t]);
      }
      uint16_t* dst = xs + t * xrow + k0 + 4 * lane;  // 8-byte aligned: rows of xrow keep 16
      const int64_t plane = T * xrow;
      if constexpr (kBf16) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          float r = v[q][i];
#pragma unroll
          for (int sp = 0; sp < St::kSplits; ++sp) {
            const __nv_bfloat16 b = __float2bfloat16_rn(r);
            dst[sp * plane + i] = __bfloat16_as_ushort(b);
            r -= __bfloat162float(b);
          }
        }
      } else {
        float m = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; ++i) m = fmaxf(m, fabsf(v[q][i]));
        m = warp_max(m);
        int e = 0;
        if (m > 0.0f && m <= 3.0e38f) frexpf(m, &e);  // m = f * 2^e, f in [0.5, 1)
        e = max(e, -100);  // keeps 2^(14 - e) finite; chunks below 2^-100 round to zero
        const float up = ldexpf(1.0f, 14 - e);
        // Pairwise conversions round each value as __float2half_rn would.
        const float2 s01 = make_float2(v[q][0] * up, v[q][1] * up), s23 = make_float2(v[q][2] * up, v[q][3] * up);
        const __half2 h01 = __float22half2_rn(s01), h23 = __float22half2_rn(s23);
        *reinterpret_cast<uint2*>(dst) = make_uint2(bits(h01), bits(h23));
        if (kExact) {
          const float2 r01 = __half22float2(h01), r23 = __half22float2(h23);
          const __half2 l01 = __float22half2_rn(make_float2(s01.x - r01.x, s01.y - r01.y));
          const __half2 l23 = __float22half2_rn(make_float2(s23.x - r23.x, s23.y - r23.y));
          *reinterpret_cast<uint2*>(dst + plane) = make_uint2(bits(l01), bits(l23));
        }
        if (lane == 0) xinv[t * nch + cc] = ldexpf(1.0f, e - 14);
      }
    }
  }
  __syncthreads();

  // Token of this lane's B column, and of its two C columns (clamped: columns
  // past T compute duplicates that are never written). Packed: B column g is
  // token g / 2's hi (even g) or lo (odd g), and both C columns are token c's.
  const int64_t tb = kPacked ? (g / 2 < T ? g / 2 : T - 1) : (g < T ? g : T - 1);
  const int64_t tc0 = kPacked ? (c < T ? c : T - 1) : (2 * c < T ? 2 * c : T - 1);
  const int64_t tc1 = kPacked ? tc0 : (2 * c + 1 < T ? 2 * c + 1 : T - 1);
  const int64_t bplane = kPacked ? int64_t(g & 1) * T * xrow : 0;  // the B column's split
  const int64_t plane = T * xrow;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (active) {
    // Refills read kDepth column blocks ahead through running pointers.
    const uint8_t* pw = wg + (kb_begin + kDepth) * 128;
    const uint8_t* pw8 = wg8 + (kb_begin + kDepth) * 128;
    for (int kb0 = kb_begin; kb0 < kb_end; kb0 += kDepth, pw += kDepth * 128, pw8 += kDepth * 128) {
#pragma unroll
      for (int d = 0; d < kDepth; ++d) {
        const int kb = kb0 + d;
        if (kb >= kb_end) break;
        // Independent accumulator chains (step x split): back-to-back MMAs on
        // one accumulator would wait out each other's latency. kQ8 keeps a
        // chain per 32-column group (cq), the unit of its scales.
        float cb[2][kMmaSplits][4] = {};
        float cq[kQ8 ? 2 : 1][kQ8 ? 2 : 1][kMmaSplits][4] = {};
#pragma unroll
        for (int st = 0; st < 2; ++st) {
          const uint4 wr = buf[d][2 * st], wr8 = buf[d][2 * st + 1];
          if constexpr (kBf16) {
            const int64_t xo = tb * xrow + kb * 64 + st * 32 + c * 8;
            uint4 xv[St::kSplits];
#pragma unroll
            for (int sp = 0; sp < St::kSplits; ++sp) xv[sp] = *reinterpret_cast<const uint4*>(xs + sp * plane + xo);
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              const uint32_t af[4] = {word(wr, 2 * j), word(wr8, 2 * j), word(wr, 2 * j + 1), word(wr8, 2 * j + 1)};
#pragma unroll
              for (int sp = 0; sp < St::kSplits; ++sp)
                mma_bf16_16816(cb[st][sp], af, word(xv[sp], 2 * j), word(xv[sp], 2 * j + 1));
            }
          } else {
            // x columns of the lane's weight bytes: [16c, 16c + 16) of the step (FP8), or
            // [8c, 8c + 8) and [32 + 8c, 40 + 8c) (kQ8).
            const int64_t xo = bplane + tb * xrow + kb * 128 + st * 64 + c * (kQ8 ? 8 : 16);
            uint4 xv[kMmaSplits][2];
#pragma unroll
            for (int sp = 0; sp < kMmaSplits; ++sp) {
              xv[sp][0] = *reinterpret_cast<const uint4*>(xs + sp * plane + xo);
              xv[sp][1] = *reinterpret_cast<const uint4*>(xs + sp * plane + xo + (kQ8 ? 32 : 8));
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              const uint32_t w0 = word(wr, j), w8 = word(wr8, j);
              uint32_t af[4];
              if constexpr (kQ8) {
                af[0] = i8x2_to_f16x2<false>(w0), af[1] = i8x2_to_f16x2<false>(w8);
                af[2] = i8x2_to_f16x2<true>(w0), af[3] = i8x2_to_f16x2<true>(w8);
              } else {
                af[0] = e4m3x2_to_f16x2(w0), af[1] = e4m3x2_to_f16x2(w8);
                af[2] = e4m3x2_hi_to_f16x2(w0), af[3] = e4m3x2_hi_to_f16x2(w8);
              }
#pragma unroll
              for (int sp = 0; sp < kMmaSplits; ++sp) {
                const uint4& xb = xv[sp][j >> 1];
                float(&acc_j)[4] = kQ8 ? cq[kQ8 ? st : 0][kQ8 ? j >> 1 : 0][sp] : cb[st][sp];
                mma_f16_16816(acc_j, af, word(xb, (2 * j) & 3), word(xb, (2 * j + 1) & 3));
              }
            }
          }
        }
        const float ws = kBf16 || kQ8 ? 1.0f : wtab[kb - kb_begin];
        // kQ8: this column block's 4 scales of rows g and g + 8 (f32), before the refill reuses sbuf[d].
        float qs[2][4];
        if constexpr (kQ8) {
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const float2 s01 = __half22float2(*reinterpret_cast<const __half2*>(&sbuf[d][r].x));
            const float2 s23 = __half22float2(*reinterpret_cast<const __half2*>(&sbuf[d][r].y));
            qs[r][0] = s01.x, qs[r][1] = s01.y, qs[r][2] = s23.x, qs[r][3] = s23.y;
          }
        }
        if (kb + kDepth < kb_end) {
          // Running pointers save ~16 instructions per column block; the
          // unpacked exact and BF16 forms (more live registers) would spill them.
          constexpr bool kRunning = kPacked || (!kExact && !kBf16);
          const uint8_t* pa = kRunning ? pw + d * 128 : wg + (kb + kDepth) * 128;
          const uint8_t* pb = kRunning ? pw8 + d * 128 : wg8 + (kb + kDepth) * 128;
          load_block(pa, pb, buf[d]);
          if constexpr (kQ8) {
            sbuf[d][0] = ld_scales8(sg + (kb + kDepth) * 8);
            sbuf[d][1] = ld_scales8(sg8 + (kb + kDepth) * 8);
          }
        }
        if constexpr (kQ8) {
          // Each 32-column group's sums times its rows' scales, in group order,
          // into cb[0][0] (cb is unused by kQ8's MMAs), then combined as below.
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            float sum = 0.0f;
#pragma unroll
            for (int st = 0; st < 2; ++st)
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                float part = 0.0f;
#pragma unroll
                for (int sp = kMmaSplits - 1; sp >= 0; --sp) part += cq[st][h][sp][i];
                sum = fmaf(part, qs[i >> 1][2 * st + h], sum);
              }
            cb[0][0][i] = sum;
          }
        }
        float cbs[4];
        if constexpr (kQ8) {
          if constexpr (kPacked) {  // columns 2c (hi) and 2c + 1 (lo) of one token: lo first, as below
#pragma unroll
            for (int r = 0; r < 4; r += 2) cbs[r] = cbs[r + 1] = cb[0][0][r + 1] + cb[0][0][r];
          } else {
#pragma unroll
            for (int i = 0; i < 4; ++i) cbs[i] = cb[0][0][i];
          }
        } else if constexpr (kPacked) {
          // C columns 2c (hi) and 2c + 1 (lo) of rows g and g + 8: lo first, as below.
#pragma unroll
          for (int r = 0; r < 4; r += 2) {
            float sum = cb[0][0][r + 1] + cb[1][0][r + 1];
            sum += cb[0][0][r] + cb[1][0][r];
            cbs[r] = cbs[r + 1] = sum;
          }
        } else {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            float sum = 0.0f;
#pragma unroll
            for (int sp = St::kSplits - 1; sp >= 0; --sp) sum += cb[0][sp][i] + cb[1][sp][i];  // small parts first
            cbs[i] = sum;
          }
        }
        if constexpr (kBf16) {
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[i] += cbs[i];
        } else {
          const float s0 = ws * xinv[tc0 * nch + kb], s1 = ws * xinv[tc1 * nch + kb];
          acc[0] = fmaf(cbs[0], s0, acc[0]);
          acc[1] = fmaf(cbs[1], s1, acc[1]);
          acc[2] = fmaf(cbs[2], s0, acc[2]);
          acc[3] = fmaf(cbs[3], s1, acc[3]);
        }
      }
    }
  }

  // Split-K: the S warps of a tile add up in part order.
  if (S > 1) {
#pragma unroll
    for (int i = 0; i < 4; ++i) red[warp][i][lane] = acc[i];
    __syncthreads();
    if (part != 0) return;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float s = 0.0f;
      for (int p = 0; p < S; ++p) s += red[warp + p][i][lane];
      acc[i] = s;
    }
  }
  if (!active) return;
  const int64_t r0 = row0 + g, r8 = row0 + g + 8;
  if constexpr (kPacked) {  // acc[1], acc[3] repeat acc[0], acc[2]
    if (c < T) {
      if (r0 < hi) y[c * ldy + r0] = acc[0];
      if (r8 < hi) y[c * ldy + r8] = acc[2];
    }
    return;
  }
  const int64_t t0 = 2 * c, t1 = 2 * c + 1;
  if (r0 < hi) {
    if (t0 < T) y[t0 * ldy + r0] = acc[0];
    if (t1 < T) y[t1 * ldy + r0] = acc[1];
  }
  if (r8 < hi) {
    if (t0 < T) y[t0 * ldy + r8] = acc[2];
    if (t1 < T) y[t1 * ldy + r8] = acc[3];
  }
}

// Dynamic shared memory of a launch: staged x, then (FP8) x's chunk scales
// and each warp's table of weight block scales (warps x ceil(K / 128 / split)).
int64_t stage_bytes(int64_t T, int64_t K, bool exact, bool bf16, int64_t warps = kMaxWarps, int64_t split = 1) {
  const int splits = bf16 ? (exact ? 3 : 2) : (exact ? 2 : 1);
  return T * (K + kPad) * 2 * splits + (bf16 ? 0 : T * (K / 128) * 4 + warps * ((K / 128 + split - 1) / split) * 4);
}

using MmaKernel = void (*)(MmaArgs);

// Tokens per launch up to which exact FP8 packs hi and lo into one MMA.
constexpr int64_t kPackedMaxTok = kMaxTok / 2;

// The forms with the FP8 staging (FP8, kQ8) of one (exact, packed).
template <bool kExact, bool kPacked>
MmaKernel fp8_staged(bool q8, bool swiglu) {
  if (q8) return swiglu ? gemv_mma_sm90<kExact, false, kPacked, true, true> : gemv_mma_sm90<kExact, false, kPacked, true>;
  return swiglu ? gemv_mma_sm90<kExact, false, kPacked, false, true> : gemv_mma_sm90<kExact, false, kPacked>;
}

// packed: exact only (hi and lo as two columns of one MMA); swiglu: FP8 staging only.
MmaKernel kernel_for(bool exact, bool bf16, bool packed = false, bool q8 = false, bool swiglu = false) {
  if (bf16) return exact ? gemv_mma_sm90<true, true, false> : gemv_mma_sm90<false, true, false>;
  if (exact && packed) return fp8_staged<true, true>(q8, swiglu);
  return exact ? fp8_staged<true, false>(q8, swiglu) : fp8_staged<false, false>(q8, swiglu);
}

Status allow_smem(MmaKernel k) { return raise_smem_limit(reinterpret_cast<const void*>(k), int(kMaxStageBytes)); }

}  // namespace

bool gemv_mma_supports(const DeviceLinear& w, int64_t row_begin, int64_t rows_per_group) {
  const bool fp8 = w.format == DevFormat::kFP8Block && w.block == 128;
  const bool bf16 = w.format == DevFormat::kBF16;
  const bool q8 = w.format == DevFormat::kQ8 && w.scale_type == DevScale::kF16 && w.scale_cols * 32 == w.in;
  return (fp8 || bf16 || q8) && w.in % 128 == 0 && w.in > 0 && reinterpret_cast<uintptr_t>(w.weight) % 16 == 0 &&
         row_begin % kTile == 0 && rows_per_group > 0 && rows_per_group % kTile == 0 &&
         stage_bytes(1, w.in, true, bf16) <= kMaxStageBytes;
}

bool gemv_mma_takes(const DeviceLinear& w, int64_t row_begin, int64_t rows_per_group) {
  static const bool bf16_routed = env_opt_in("AFF_CUDA_BF16_MMA");
  // Large BF16 weights (the heads: V4's 1.06 GB, the tiny model's 66 MB)
  // stream faster here: V4's head 269 vs 312 us (aff-bench-gemv --floors,
  // docs/BENCHMARKS.md). The small ones (compressor and indexer projections,
  // <= 4 MB at V4 size) measured no faster than gemv_any in the decode step.
  constexpr int64_t kBf16MmaMinBytes = int64_t(32) << 20;
  const bool bf16_large = w.format == DevFormat::kBF16 && stored_bytes(w) >= kBf16MmaMinBytes;
  return (w.format != DevFormat::kBF16 || bf16_routed || bf16_large) && gemv_mma_supports(w, row_begin, rows_per_group);
}

bool gemv_mma_takes_all(const DeviceLinear& w) { return gemv_mma_takes(w, 0, round_up16(w.out)); }

Status gemv_mma_prepare() {
  for (bool exact : {true, false}) AFF_RETURN_IF_ERROR(allow_smem(kernel_for(exact, /*bf16=*/true)));
  for (bool q8 : {false, true})
    for (bool swiglu : {false, true}) {
      for (bool exact : {true, false}) AFF_RETURN_IF_ERROR(allow_smem(kernel_for(exact, false, false, q8, swiglu)));
      AFF_RETURN_IF_ERROR(allow_smem(kernel_for(true, false, true, q8, swiglu)));
    }
  return Status::ok();
}

namespace {

// Plans and launches rows [row_begin, row_end) of w, or, when pair2 is set,
// w's rows [0, w.out) stacked over pair2's [0, pair2->out).
Status launch_mma(const DeviceLinear& w, int64_t row_begin, int64_t row_end, const float* x, int64_t ldx, int64_t T,
                  float* y, int64_t ldy, int64_t rows_per_group, int64_t x_group_stride, const DeviceLinear* pair2,
                  float* y2, int64_t ldy2, cudaStream_t stream, const float* x_norm = nullptr, float eps = 0.0f,
                  const HcCombJob& job = {}, const StepInfo* run_step = nullptr, int run_ratio = 0,
                  int max_blocks = 0, const float* x_up = nullptr, float swiglu_limit = 0.0f,
                  bool programmatic = true) {
  const int64_t n_rows = row_end - row_begin;
  if (n_rows <= 0 || T <= 0) return Status::ok();
  const bool exact = mma_precision() != MmaPrecision::kBf16;
  const bool bf16 = w.format == DevFormat::kBF16;
  // AFF_CUDA_GEMV_PACKED=0: two MMAs per fragment at every T (comparisons).
  static const bool pack_ok = env_switch_on("AFF_CUDA_GEMV_PACKED");
  if (x_up != nullptr && bf16) return internal_error("gemv_mma: no SwiGLU staging for BF16 weights");
  const MmaKernel kernel =
      kernel_for(exact, bf16, pack_ok && T <= kPackedMaxTok, w.format == DevFormat::kQ8, x_up != nullptr);
  AFF_RETURN_IF_ERROR(allow_smem(kernel));
  const int sms = current_device_multiprocessors();
  const int64_t groups = (row_end - 1) / rows_per_group - row_begin / rows_per_group + 1;
  if (groups > 65535) return internal_error("gemv_mma: too many row groups");
  const int64_t tiles_per_group = (std::min(n_rows, rows_per_group) + kTile - 1) / kTile;
  const int64_t tiles = (n_rows + kTile - 1) / kTile;
  // Split K while tiles are too few to give every SM ~12 warps, keeping >= 1
  // column block per warp; then enough tiles per block for >= 8 warps.
  const int64_t nkb = w.in / (bf16 ? 64 : 128);
  // (Aiming at 8 warps per SM measured the same decode step, 16 or 24 0.6 ms slower.)
  // AFF_CUDA_GEMV_WARPS_SM / AFF_CUDA_GEMV_BLOCK_WARPS: tuning knobs for both numbers.
  static const int warps_sm = env_int("AFF_CUDA_GEMV_WARPS_SM", 12, 1, 64);
  static const int block_warps = env_int("AFF_CUDA_GEMV_BLOCK_WARPS", 8, 1, kMaxWarps);
  int split = 1;
  while (split < kMaxWarps && split * 2 <= nkb && tiles * split < int64_t(sms) * warps_sm) split *= 2;
  int rt = int(std::max<int64_t>(1, std::min<int64_t>(std::max(1, block_warps / split), tiles_per_group)));
  if (max_blocks > 0 && (tiles_per_group + rt - 1) / rt > max_blocks) {  // fewer, wider blocks
    rt = int(std::min<int64_t>(kMaxWarps, (tiles_per_group + max_blocks - 1) / max_blocks));
    split = std::max(1, std::min(split, kMaxWarps / rt));
  }
  const int64_t blocks = (tiles_per_group + rt - 1) / rt;
  // Tokens per launch: as many as the staging allows (more launches re-read the weights).
  int64_t tc = std::min<int64_t>(T, kMaxTok);
  while (tc > 1 && stage_bytes(tc, w.in, exact, bf16, split * rt, split) > kMaxStageBytes) --tc;
  const size_t smem = size_t(stage_bytes(tc, w.in, exact, bf16, split * rt, split));
  const int64_t rows1 = pair2 ? w.out : 0;
  const bool x_vec = reinterpret_cast<uintptr_t>(x) % 16 == 0 && ldx % 4 == 0 && x_group_stride % 4 == 0;
  if (job.comb != nullptr && groups != 1) return internal_error("gemv_mma: a comb job needs one row group");
  for (int64_t t0 = 0; t0 < T; t0 += tc) {
    const int64_t n = std::min(tc, T - t0);
    MmaArgs a{w, row_begin, n_rows, x + t0 * ldx, ldx, n, rows_per_group, x_group_stride, y + t0 * ldy, ldy,
              split, rt, rows1, pair2 ? *pair2 : w, pair2 ? y2 + t0 * ldy2 : nullptr, ldy2, x_norm, eps,
              t0 == 0 ? job : HcCombJob{}, run_step, run_ratio, row_begin / rows_per_group, x_vec,
              x_up != nullptr ? x_up + t0 * ldx : nullptr, swiglu_limit};
    const dim3 grid{unsigned(blocks + (a.job.comb != nullptr ? 1 : 0)), unsigned(groups)};
    const dim3 block(unsigned(split * rt * 32));
    if (programmatic) {
      AFF_RETURN_IF_ERROR(cuda_status(launch_pdl(kernel, grid, block, smem, stream, a), "gemv_mma_sm90"));
    } else {
      kernel<<<grid, block, smem, stream>>>(a);
      AFF_RETURN_IF_ERROR(launch_status("gemv_mma_sm90"));
    }
  }
  return Status::ok();
}

}  // namespace

Status gemv_mma(const DeviceLinear& w, int64_t row_begin, int64_t row_end, const float* x, int64_t ldx, int64_t T,
                float* y, int64_t ldy, int64_t rows_per_group, int64_t x_group_stride, cudaStream_t stream) {
  if (row_end <= row_begin || T <= 0) return Status::ok();
  if (!gemv_mma_supports(w, row_begin, rows_per_group)) return internal_error("gemv_mma: unsupported weight");
  return launch_mma(w, row_begin, row_end, x, ldx, T, y, ldy, rows_per_group, x_group_stride, nullptr, nullptr, 0,
                    stream);
}

Status gemv_mma_normed(const DeviceLinear& w, const float* x, int64_t T, float* y, const float* norm, float eps,
                       cudaStream_t stream, int max_blocks, bool programmatic) {
  if (T <= 0) return Status::ok();
  const int64_t whole = round_up16(w.out);  // one group: every row reads x
  if (!gemv_mma_supports(w, 0, whole) || norm == nullptr) return internal_error("gemv_mma_normed: unsupported weight");
  return launch_mma(w, 0, w.out, x, w.in, T, y, w.out, whole, 0, nullptr, nullptr, 0, stream, norm, eps, {}, nullptr,
                    0, max_blocks, nullptr, 0.0f, programmatic);
}

Status gemv_mma_side(const DeviceLinear& w, const float* x, int64_t ldx, int64_t T, float* y, int64_t ldy,
                     int max_blocks, cudaStream_t stream) {
  if (T <= 0) return Status::ok();
  const int64_t whole = round_up16(w.out);
  if (!gemv_mma_supports(w, 0, whole)) return internal_error("gemv_mma_side: unsupported weight");
  return launch_mma(w, 0, w.out, x, ldx, T, y, ldy, whole, 0, nullptr, nullptr, 0, stream, nullptr, 0.0f, {},
                    nullptr, 0, max_blocks, nullptr, 0.0f, /*programmatic=*/false);
}

Status gemv_mma_swiglu(const DeviceLinear& w, const float* gate, const float* up, int64_t ldx, int64_t T,
                       float swiglu_limit, float* y, int64_t ldy, int max_blocks, cudaStream_t stream) {
  if (T <= 0) return Status::ok();
  const int64_t whole = round_up16(w.out);
  if (!gemv_mma_supports(w, 0, whole) || gate == nullptr || up == nullptr)
    return internal_error("gemv_mma_swiglu: unsupported weight");
  // Not a programmatic dependent: the decode MoE runs it on a side stream,
  // where blocks resident early would hold SMs the routed launches need.
  return launch_mma(w, 0, w.out, gate, ldx, T, y, ldy, whole, 0, nullptr, nullptr, 0, stream, nullptr, 0.0f, {},
                    nullptr, 0, max_blocks, up, swiglu_limit, /*programmatic=*/false);
}

bool gemv_mma_pair_supports(const DeviceLinear& w1, const DeviceLinear& w2) {
  return gemv_mma_supports(w1, 0, round_up16(w1.out + w2.out)) && gemv_mma_supports(w2, 0, round_up16(w2.out)) && w1.out % kTile == 0 &&
         w1.format == w2.format && w1.in == w2.in && w1.block == w2.block && w1.scale_type == w2.scale_type &&
         w1.scale_cols == w2.scale_cols;
}

Status gemv_mma_pair(const DeviceLinear& w1, const DeviceLinear& w2, const float* x, int64_t ldx, int64_t T, float* y1,
                     int64_t ldy1, float* y2, int64_t ldy2, cudaStream_t stream, const PairOptions& o) {
  if (T <= 0) return hc_comb_run(o.job, stream);
  if (!gemv_mma_pair_supports(w1, w2)) return internal_error("gemv_mma_pair: weights cannot share a launch");
  if (o.norm != nullptr && ldx != w1.in) return internal_error("gemv_mma_pair: a normed x must be packed");
  if (o.step != nullptr && o.complete_ratio <= 0) return internal_error("gemv_mma_pair: a step gate needs a ratio");
  if (o.step != nullptr && o.job.comb != nullptr)
    return internal_error("gemv_mma_pair: a launch that may skip itself cannot carry a comb job");
  const int64_t rows = w1.out + w2.out;
  return launch_mma(w1, 0, rows, x, ldx, T, y1, ldy1, round_up16(rows), 0, &w2, y2, ldy2, stream, o.norm, o.eps, o.job,
                    o.step, o.step != nullptr ? o.complete_ratio : 0, o.max_blocks);
}

}  // namespace aff::cuda
