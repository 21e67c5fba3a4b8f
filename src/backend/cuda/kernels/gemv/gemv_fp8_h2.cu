// gemv_fp8_h2_sm90: decode GEMV (T = 1) for FP8 E4M3 weights with 128x128
// block scales, in the fast precision setting. The f32 path decodes every
// element and issues one f32 FMA per element, which bounds it by instruction
// issue at ~1.7 TB/s. Here each lane converts its 16 weight bytes with the
// hardware E4M3x2 -> f16x2 conversion and multiplies them against x held in
// shared memory as f16 with packed HFMA2: half the math instructions, the f32
// work once per 16 elements. x is scaled by 1/max|x| before rounding to f16 so
// that the f16 partial sums (8 products of |w| <= 448, |x| <= 1) cannot
// overflow; the scale is restored in f32.
//
// Layout: a warp owns one row at a time (or 1/S of a row's columns when rows
// are few: split-K, reduced in shared memory in a fixed order). Per step a
// lane reads 16 consecutive bytes, a warp 512: four 128-column scale blocks.
// Rows of `groups` consecutive row blocks may each read their own slice of x
// (the attention's grouped output projection in one launch).
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "backend/cuda/kernels/common/decode.cuh"
#include "backend/cuda/kernels/gemv/gemv.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/device_info.h"

namespace aff::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kUnroll = 4;          // 16-byte loads in flight per lane
constexpr int64_t kMaxIn = 16384;   // x staged as f16: 32 KB of shared memory per block

struct H2Args {
  DeviceLinear w;
  int64_t row_begin, n_rows;
  const float* x;        // group of row_begin's slice first, then one slice per x_group_stride
  int64_t rows_per_group, x_group_stride;
  float* y;              // [n_rows]
  int split;             // warps per row
};

__device__ __forceinline__ __half2 fp8x2_to_h2(uint16_t v) {
  const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v), __NV_E4M3);
  return *reinterpret_cast<const __half2*>(&r);
}

__global__ void __launch_bounds__(kWarps * 32) gemv_fp8_h2_sm90(H2Args a) {
  extern __shared__ __align__(16) __half xs[];  // [in] this group's x, scaled
  __shared__ float red[kWarps];
  __shared__ float scale_sh[1];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t in = a.w.in;
  // grid.y walks the row groups this launch touches; each block stays inside one.
  const int64_t g = a.row_begin / a.rows_per_group + blockIdx.y;
  const int64_t lo = max(a.row_begin, g * a.rows_per_group) - a.row_begin;
  const int64_t hi = min(a.row_begin + a.n_rows, (g + 1) * a.rows_per_group) - a.row_begin;
  const float* xg_f32 = a.x + (g - a.row_begin / a.rows_per_group) * a.x_group_stride;

  // Stage x as f16 scaled by 1/max|x|.
  float m = 0.0f;
  for (int64_t i = threadIdx.x; i < in; i += blockDim.x) m = fmaxf(m, fabsf(xg_f32[i]));
  m = warp_max(m);
  if (lane == 0) red[warp] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    float mm = 0.0f;
    for (int w = 0; w < kWarps; ++w) mm = fmaxf(mm, red[w]);
    scale_sh[0] = mm;
  }
  __syncthreads();
  const float xmax = scale_sh[0];
  const float to_unit = xmax > 0.0f ? 1.0f / xmax : 0.0f;
  for (int64_t i = threadIdx.x; i < in; i += blockDim.x) xs[i] = __float2half_rn(xg_f32[i] * to_unit);
  __syncthreads();

  const int S = a.split, R = kWarps / S;
  const int part = warp % S, sub = warp / S;
  const int64_t steps = in / 512;  // 512 columns per warp step
  __shared__ float partial[kWarps];
  for (int64_t base = lo + int64_t(blockIdx.x) * R; base < hi; base += int64_t(gridDim.x) * R) {
    const int64_t r = base + sub;
    float acc = 0.0f;
    if (r < hi) {
      const int64_t row = a.row_begin + r;
      const __half* xg = xs;
      const uint8_t* wr = a.w.weight + row * in;
      const int64_t srow = (row / a.w.block) * a.w.scale_cols;
      for (int64_t s0 = part; s0 < steps; s0 += int64_t(S) * kUnroll) {
        uint4 wv[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int64_t s = s0 + int64_t(u) * S;
          if (s < steps)
            wv[u] = __ldcs(reinterpret_cast<const uint4*>(wr + s * 512 + lane * 16));
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int64_t s = s0 + int64_t(u) * S;
          if (s >= steps) break;
          const int64_t col = s * 512 + lane * 16;
          const uint4 xa = *reinterpret_cast<const uint4*>(xg + col);
          const uint4 xb = *reinterpret_cast<const uint4*>(xg + col + 8);
          const uint32_t wq[4] = {wv[u].x, wv[u].y, wv[u].z, wv[u].w};
          const uint32_t xw[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
          __half2 h = __float2half2_rn(0.0f);
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            h = __hfma2(fp8x2_to_h2(uint16_t(wq[q] & 0xffffu)), *reinterpret_cast<const __half2*>(&xw[2 * q]), h);
            h = __hfma2(fp8x2_to_h2(uint16_t(wq[q] >> 16)), *reinterpret_cast<const __half2*>(&xw[2 * q + 1]), h);
          }
          const float2 hf = __half22float2(h);
          acc = fmaf(hf.x + hf.y, load_scale(a.w, srow + col / a.w.block), acc);
        }
      }
      acc = warp_sum(acc);
    }
    if (S > 1) {
      if (lane == 0) partial[warp] = acc;
      __syncthreads();
      if (part == 0 && lane == 0 && r < hi) {
        float t = 0.0f;
        for (int p = 0; p < S; ++p) t += partial[sub * S + p];  // fixed order: deterministic
        a.y[r] = t * xmax;
      }
      __syncthreads();
    } else if (lane == 0 && r < hi) {
      a.y[r] = acc * xmax;
    }
  }
}

}  // namespace

bool gemv_fp8_h2_supports(const DeviceLinear& w) {
  return w.format == DevFormat::kFP8Block && w.block == 128 && w.in % 512 == 0 && w.in <= kMaxIn &&
         reinterpret_cast<uintptr_t>(w.weight) % 16 == 0;
}

Status gemv_fp8_h2(const DeviceLinear& w, int64_t row_begin, int64_t row_end, const float* x, int64_t rows_per_group,
                   int64_t x_group_stride, float* y, cudaStream_t stream) {
  const int64_t n_rows = row_end - row_begin;
  if (n_rows <= 0) return Status::ok();
  if (!gemv_fp8_h2_supports(w) || rows_per_group <= 0) return internal_error("gemv_fp8_h2: unsupported weight");
  const int sms = current_device_multiprocessors();
  const int64_t groups = (row_end - 1) / rows_per_group - row_begin / rows_per_group + 1;
  if (groups > 65535) return internal_error("gemv_fp8_h2: too many row groups");
  const int64_t rows_per_grp = std::min(n_rows, rows_per_group);
  // Split a row over warps while rows are too few to give every SM ~32 warps,
  // as long as each warp keeps at least one 512-column step.
  const int64_t steps = w.in / 512;
  int split = 1;
  while (split < kWarps && n_rows * split < int64_t(sms) * 32 && steps >= split * 2) split *= 2;
  const int64_t rows_per_block = kWarps / split;
  const int64_t blocks = std::max<int64_t>(
      1, std::min<int64_t>((rows_per_grp + rows_per_block - 1) / rows_per_block, int64_t(sms) * 8 / groups + 1));
  const size_t smem = size_t(w.in) * sizeof(__half);
  H2Args a{w, row_begin, n_rows, x, rows_per_group, x_group_stride, y, split};
  gemv_fp8_h2_sm90<<<dim3(unsigned(blocks), unsigned(groups)), kWarps * 32, smem, stream>>>(a);
  return launch_status("gemv_fp8_h2_sm90");
}

}  // namespace aff::cuda
