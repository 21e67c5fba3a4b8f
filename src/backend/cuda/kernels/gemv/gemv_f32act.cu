// GEMV/skinny GEMM kernels, one per weight format: gemv_<weightfmt>_f32_sm90.
// Grid: x = row tiles of kRowsPerBlock rows (one warp per row), y = token tiles
// of kTokTile tokens. Byte budget per launch: the weight once per token tile.
#include "backend/cuda/kernels/gemv/gemv.h"

#include "backend/cuda/kernels/common/row_dot.cuh"
#include "backend/cuda/runtime/cuda_check.h"

namespace aff::cuda {
namespace {

constexpr int kRowsPerBlock = 8;

struct GemvArgs {
  DeviceLinear w;
  int64_t row_begin, n_rows;
  const float* x;
  int64_t ldx, T;
  float* y;
  int64_t ldy;
};

template <DevFormat F>
__device__ __forceinline__ void gemv_body(const GemvArgs& a) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t r = int64_t(blockIdx.x) * kRowsPerBlock + warp;
  const int64_t t0 = int64_t(blockIdx.y) * kTokTile;
  if (r >= a.n_rows) return;
  const int nt = a.T - t0 < kTokTile ? int(a.T - t0) : kTokTile;
  float acc[kTokTile] = {0.0f, 0.0f, 0.0f, 0.0f};
  row_dot_partial<F>(a.w, a.row_begin + r, a.x + t0 * a.ldx, a.ldx, nt, acc);
#pragma unroll
  for (int t = 0; t < kTokTile; ++t) {
    const float v = warp_sum(acc[t]);
    if (lane == 0 && t < nt) a.y[(t0 + t) * a.ldy + r] = v;
  }
}

__global__ void __launch_bounds__(kRowsPerBlock * 32) gemv_f32_f32_sm90(GemvArgs a) { gemv_body<DevFormat::kF32>(a); }
__global__ void __launch_bounds__(kRowsPerBlock * 32) gemv_bf16_f32_sm90(GemvArgs a) { gemv_body<DevFormat::kBF16>(a); }
__global__ void __launch_bounds__(kRowsPerBlock * 32) gemv_f16_f32_sm90(GemvArgs a) { gemv_body<DevFormat::kF16>(a); }
__global__ void __launch_bounds__(kRowsPerBlock * 32) gemv_fp8b_f32_sm90(GemvArgs a) { gemv_body<DevFormat::kFP8Block>(a); }
__global__ void __launch_bounds__(kRowsPerBlock * 32) gemv_mxfp4_f32_sm90(GemvArgs a) { gemv_body<DevFormat::kMXFP4>(a); }
__global__ void __launch_bounds__(kRowsPerBlock * 32) gemv_ggml_f32_sm90(GemvArgs a) { gemv_body<DevFormat::kGgml>(a); }

using GemvKernel = void (*)(GemvArgs);

// Selection only: the kernel for a weight format (f32 activations, sm90).
GemvKernel select_gemv_kernel(DevFormat f) {
  switch (f) {
    case DevFormat::kF32: return gemv_f32_f32_sm90;
    case DevFormat::kBF16: return gemv_bf16_f32_sm90;
    case DevFormat::kF16: return gemv_f16_f32_sm90;
    case DevFormat::kFP8Block: return gemv_fp8b_f32_sm90;
    case DevFormat::kMXFP4: return gemv_mxfp4_f32_sm90;
    case DevFormat::kGgml: return gemv_ggml_f32_sm90;
  }
  return nullptr;
}

}  // namespace

Status gemv_rows_f32(const DeviceLinear& w, int64_t row_begin, int64_t row_end, const float* x,
                     int64_t ldx, int64_t T, float* y, int64_t ldy, cudaStream_t stream) {
  if (row_begin < 0 || row_begin > row_end || row_end > w.out)
    return internal_error("gemv: row range outside the weight");
  const int64_t n_rows = row_end - row_begin;
  if (n_rows == 0 || T == 0) return Status::ok();
  const GemvKernel k = select_gemv_kernel(w.format);
  if (!k) return internal_error("gemv: no kernel for this weight format");
  const dim3 grid(unsigned((n_rows + kRowsPerBlock - 1) / kRowsPerBlock), unsigned((T + kTokTile - 1) / kTokTile));
  if (grid.y > 65535u) return internal_error("gemv: too many tokens in one launch");
  k<<<grid, kRowsPerBlock * 32, 0, stream>>>(GemvArgs{w, row_begin, n_rows, x, ldx, T, y, ldy});
  return launch_status("gemv_f32");
}

}  // namespace aff::cuda
