// gemv_fp8_mma_sm90: decode GEMV (T <= 8 tokens) for FP8 E4M3 weights with
// 128x128 block scales, on tensor cores.
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
// rounding from the scaling). Exact setting: x = hi + lo (two f16), two MMAs
// per fragment, ~2^-22 relative, the f32 reference to rounding. Fast setting:
// hi alone, ~2^-12 relative per element. Each 128-column block's MMA sums are
// multiplied by (weight block scale) x (x block scale) and added in f32.
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
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <mutex>
#include <set>

#include "backend/cuda/kernels/common/decode.cuh"
#include "backend/cuda/kernels/gemm/mma_bf16.cuh"
#include "backend/cuda/kernels/gemm/mma_precision.h"
#include "backend/cuda/kernels/gemv/gemv.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/device_info.h"
#include "backend/cuda/runtime/pdl.h"

namespace aff::cuda {
namespace {

constexpr int kTile = 16;          // weight rows per warp tile (the MMA's M)
constexpr int kMaxTok = 8;         // tokens per launch (the MMA's N)
constexpr int kMaxWarps = 16;
constexpr int kPad = 8;            // f16 after each staged token row: rows start 16 bytes apart mod 128
constexpr int64_t kMaxStageBytes = 96 * 1024;

struct MmaArgs {
  DeviceLinear w;
  int64_t row_begin, n_rows;       // rows [row_begin, row_begin + n_rows) of w
  const float* x;                  // token t, group 0: x + t * ldx; group g adds g * x_group_stride
  int64_t ldx, T;
  int64_t rows_per_group, x_group_stride;
  float* y;                        // token t: y + t * ldy, row r at (r - row_begin)
  int64_t ldy;
  int split, tiles_per_block;
};

__device__ __forceinline__ uint4 ld_stream(const uint8_t* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t v) {
  const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v & 0xffffu), __NV_E4M3);
  return uint32_t(r.x) | (uint32_t(r.y) << 16);
}

__device__ __forceinline__ uint32_t word(const uint4& v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

// kDepth: 128-column blocks of weight loads in flight per lane (16 registers
// each). Measured on the H200: 3 at up to 128 registers beat 2 at <= 85
// registers with 1.5x the resident warps (8.29 vs 9.38 ms per decode token).
constexpr int kDepth = 3;

template <bool kExact>
__global__ void __launch_bounds__(kMaxWarps * 32) gemv_fp8_mma_sm90(MmaArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ float red[kMaxWarps][4][32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3;
  const int S = a.split, part = warp % S, sub = warp / S;
  const int64_t K = a.w.in, nkb = K / 128, T = a.T;
  const int64_t xrow = K + kPad;  // f16 per staged token row

  // This block's group and tile.
  const int64_t grp = a.row_begin / a.rows_per_group + blockIdx.y;
  const int64_t lo = max(a.row_begin, grp * a.rows_per_group);
  const int64_t hi = min(a.row_begin + a.n_rows, (grp + 1) * a.rows_per_group);
  const int64_t row0 = lo + (int64_t(blockIdx.x) * a.tiles_per_block + sub) * kTile;
  const bool active = row0 < hi;  // warp-uniform
  const int64_t kb_begin = nkb * part / S, kb_end = nkb * (part + 1) / S;

  // Issue the first weight loads before staging x (they do not depend on it).
  const int64_t rg = min(row0 + g, hi - 1), rg8 = min(row0 + g + 8, hi - 1);  // tail rows re-read the last
  const uint8_t* wg = a.w.weight + rg * K + c * 16;
  const uint8_t* wg8 = a.w.weight + rg8 * K + c * 16;
  // The block scales travel with the weights: loaded at use, each would cost
  // a full memory latency per column block.
  const int64_t srow = (min(row0, hi - 1) / a.w.block) * a.w.scale_cols;
  uint4 buf[kDepth][4];
  uint32_t sraw[kDepth];
#pragma unroll
  for (int d = 0; d < kDepth; ++d) {
    const int64_t kb = kb_begin + d;
    if (active && kb < kb_end) {
      buf[d][0] = ld_stream(wg + kb * 128);
      buf[d][1] = ld_stream(wg8 + kb * 128);
      buf[d][2] = ld_stream(wg + kb * 128 + 64);
      buf[d][3] = ld_stream(wg8 + kb * 128 + 64);
      sraw[d] = load_scale_raw(a.w, srow + kb);
    }
  }

  // Launched as a programmatic dependent: everything above read only weights;
  // x is the previous kernel's output. The whole grid is resident, so the next
  // kernel may start its own prologue now.
  pdl_launch_dependents();
  pdl_wait();

  // Stage x: per token and 128-column block, f16 hi (and lo) scaled by 2^e.
  __half* xh = reinterpret_cast<__half*>(smem);
  __half* xl = xh + T * xrow;
  float* xinv = reinterpret_cast<float*>(smem + T * xrow * 2 * (kExact ? 2 : 1));  // [T, nkb]
  const float* xg = a.x + (grp - a.row_begin / a.rows_per_group) * a.x_group_stride;
  const int nwarps = blockDim.x >> 5;
  // Four chunks per warp per round, all loads issued before any is used.
  constexpr int kChunks = 4;
  for (int64_t ch0 = warp; ch0 < T * nkb; ch0 += int64_t(nwarps) * kChunks) {
    float v[kChunks][4];
#pragma unroll
    for (int q = 0; q < kChunks; ++q) {
      const int64_t ch = ch0 + int64_t(q) * nwarps;
      if (ch >= T * nkb) break;
      const float* src = xg + (ch / nkb) * a.ldx + (ch % nkb) * 128;
#pragma unroll
      for (int i = 0; i < 4; ++i) v[q][i] = src[lane + 32 * i];
    }
#pragma unroll
    for (int q = 0; q < kChunks; ++q) {
      const int64_t ch = ch0 + int64_t(q) * nwarps;
      if (ch >= T * nkb) break;
      const int64_t t = ch / nkb, kb = ch % nkb;
      float m = 0.0f;
#pragma unroll
      for (int i = 0; i < 4; ++i) m = fmaxf(m, fabsf(v[q][i]));
      m = warp_max(m);
      int e = 0;
      if (m > 0.0f && m <= 3.0e38f) frexpf(m, &e);  // m = f * 2^e, f in [0.5, 1)
      e = max(e, -100);  // keeps 2^(14 - e) finite; blocks below 2^-100 round to zero
      const float up = ldexpf(1.0f, 14 - e);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float sv = v[q][i] * up;
        const __half h = __float2half_rn(sv);
        xh[t * xrow + kb * 128 + lane + 32 * i] = h;
        if (kExact) xl[t * xrow + kb * 128 + lane + 32 * i] = __float2half_rn(sv - __half2float(h));
      }
      if (lane == 0) xinv[t * nkb + kb] = ldexpf(1.0f, e - 14);
    }
  }
  __syncthreads();

  // Token of this lane's B column, and of its two C columns (clamped: columns
  // past T compute duplicates that are never written).
  const int64_t tb = g < T ? g : T - 1;
  const int64_t tc0 = 2 * c < T ? 2 * c : T - 1, tc1 = 2 * c + 1 < T ? 2 * c + 1 : T - 1;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (active) {
    for (int64_t kb0 = kb_begin; kb0 < kb_end; kb0 += kDepth) {
#pragma unroll
      for (int d = 0; d < kDepth; ++d) {
        const int64_t kb = kb0 + d;
        if (kb >= kb_end) break;
        // Four independent accumulator chains (step x hi/lo): back-to-back
        // MMAs on one accumulator would wait out each other's latency.
        float cb[2][2][4] = {};
#pragma unroll
        for (int st = 0; st < 2; ++st) {
          const uint4 wr = buf[d][2 * st], wr8 = buf[d][2 * st + 1];
          const int64_t xo = tb * xrow + kb * 128 + st * 64 + c * 16;
          const uint4 h0 = *reinterpret_cast<const uint4*>(xh + xo);
          const uint4 h1 = *reinterpret_cast<const uint4*>(xh + xo + 8);
          uint4 l0, l1;
          if (kExact) {
            l0 = *reinterpret_cast<const uint4*>(xl + xo);
            l1 = *reinterpret_cast<const uint4*>(xl + xo + 8);
          }
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const uint32_t w0 = word(wr, j), w8 = word(wr8, j);
            const uint32_t af[4] = {e4m3x2_to_f16x2(w0), e4m3x2_to_f16x2(w8), e4m3x2_to_f16x2(w0 >> 16),
                                    e4m3x2_to_f16x2(w8 >> 16)};
            const uint4& hb = j < 2 ? h0 : h1;
            mma_f16_16816(cb[st][0], af, word(hb, (2 * j) & 3), word(hb, (2 * j + 1) & 3));
            if (kExact) {
              const uint4& lb = j < 2 ? l0 : l1;
              mma_f16_16816(cb[st][1], af, word(lb, (2 * j) & 3), word(lb, (2 * j + 1) & 3));
            }
          }
        }
        const float ws = decode_scale(a.w, sraw[d]);
        if (kb + kDepth < kb_end) {
          buf[d][0] = ld_stream(wg + (kb + kDepth) * 128);
          buf[d][1] = ld_stream(wg8 + (kb + kDepth) * 128);
          buf[d][2] = ld_stream(wg + (kb + kDepth) * 128 + 64);
          buf[d][3] = ld_stream(wg8 + (kb + kDepth) * 128 + 64);
          sraw[d] = load_scale_raw(a.w, srow + kb + kDepth);
        }
        float cbs[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) cbs[i] = (cb[0][0][i] + cb[1][0][i]) + (cb[0][1][i] + cb[1][1][i]);
        const float s0 = ws * xinv[tc0 * nkb + kb], s1 = ws * xinv[tc1 * nkb + kb];
        acc[0] = fmaf(cbs[0], s0, acc[0]);
        acc[1] = fmaf(cbs[1], s1, acc[1]);
        acc[2] = fmaf(cbs[2], s0, acc[2]);
        acc[3] = fmaf(cbs[3], s1, acc[3]);
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
  const int64_t t0 = 2 * c, t1 = 2 * c + 1;
  float* y = a.y - a.row_begin;
  if (r0 < hi) {
    if (t0 < T) y[t0 * a.ldy + r0] = acc[0];
    if (t1 < T) y[t1 * a.ldy + r0] = acc[1];
  }
  if (r8 < hi) {
    if (t0 < T) y[t0 * a.ldy + r8] = acc[2];
    if (t1 < T) y[t1 * a.ldy + r8] = acc[3];
  }
}

int64_t stage_bytes(int64_t T, int64_t K, bool exact) {
  return T * (K + kPad) * 2 * (exact ? 2 : 1) + T * (K / 128) * 4;
}

using MmaKernel = void (*)(MmaArgs);

MmaKernel kernel_for(bool exact) { return exact ? gemv_fp8_mma_sm90<true> : gemv_fp8_mma_sm90<false>; }

Status allow_smem(MmaKernel k) {
  static std::mutex mu;
  static std::set<MmaKernel> done;  // set before any capture (gemv_prepare)
  std::lock_guard<std::mutex> lock(mu);
  if (done.count(k)) return Status::ok();
  AFF_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kMaxStageBytes)));
  done.insert(k);
  return Status::ok();
}

}  // namespace

bool gemv_fp8_mma_supports(const DeviceLinear& w, int64_t row_begin, int64_t rows_per_group) {
  return w.format == DevFormat::kFP8Block && w.block == 128 && w.in % 128 == 0 && w.in > 0 &&
         reinterpret_cast<uintptr_t>(w.weight) % 16 == 0 && row_begin % kTile == 0 && rows_per_group > 0 &&
         rows_per_group % kTile == 0 && stage_bytes(1, w.in, true) <= kMaxStageBytes;
}

Status gemv_fp8_mma_prepare() {
  AFF_RETURN_IF_ERROR(allow_smem(kernel_for(true)));
  return allow_smem(kernel_for(false));
}

Status gemv_fp8_mma(const DeviceLinear& w, int64_t row_begin, int64_t row_end, const float* x, int64_t ldx,
                    int64_t T, float* y, int64_t ldy, int64_t rows_per_group, int64_t x_group_stride,
                    cudaStream_t stream) {
  const int64_t n_rows = row_end - row_begin;
  if (n_rows <= 0 || T <= 0) return Status::ok();
  if (!gemv_fp8_mma_supports(w, row_begin, rows_per_group)) return internal_error("gemv_fp8_mma: unsupported weight");
  const bool exact = mma_precision() != MmaPrecision::kBf16;
  const MmaKernel kernel = kernel_for(exact);
  AFF_RETURN_IF_ERROR(allow_smem(kernel));
  const int sms = current_device_multiprocessors();
  const int64_t groups = (row_end - 1) / rows_per_group - row_begin / rows_per_group + 1;
  if (groups > 65535) return internal_error("gemv_fp8_mma: too many row groups");
  const int64_t tiles_per_group = (std::min(n_rows, rows_per_group) + kTile - 1) / kTile;
  const int64_t tiles = (n_rows + kTile - 1) / kTile;
  // Split K while tiles are too few to give every SM ~12 warps, keeping >= 1
  // column block per warp; then enough tiles per block for >= 8 warps.
  const int64_t nkb = w.in / 128;
  int split = 1;
  while (split < kMaxWarps && split * 2 <= nkb && tiles * split < int64_t(sms) * 12) split *= 2;
  const int rt = int(std::max<int64_t>(1, std::min<int64_t>(8 / split, tiles_per_group)));
  const int64_t blocks = (tiles_per_group + rt - 1) / rt;
  // Tokens per launch: as many as the staging allows (more launches re-read the weights).
  int64_t tc = std::min<int64_t>(T, kMaxTok);
  while (tc > 1 && stage_bytes(tc, w.in, exact) > kMaxStageBytes) --tc;
  const size_t smem = size_t(stage_bytes(tc, w.in, exact));
  for (int64_t t0 = 0; t0 < T; t0 += tc) {
    const int64_t n = std::min(tc, T - t0);
    MmaArgs a{w, row_begin, n_rows, x + t0 * ldx, ldx, n, rows_per_group, x_group_stride, y + t0 * ldy, ldy,
              split, rt};
    const dim3 grid{unsigned(blocks), unsigned(groups)};
    const dim3 block(unsigned(split * rt * 32));
    AFF_RETURN_IF_ERROR(cuda_status(
        launch_pdl(kernel, grid, block, smem, stream, a),
        "gemv_fp8_mma_sm90"));
  }
  return Status::ok();
}

}  // namespace aff::cuda
