// rmsnorm_f32_sm90: one block of 256 threads per row; the sum of squares is
// reduced in f32 (warp shuffles, then across warps through shared memory).
#include "backend/cuda/kernels/common/decode.cuh"
#include "backend/cuda/kernels/norm/norm.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/pdl.h"

namespace aff::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) rmsnorm_f32_sm90(const float* x, float* y, int64_t n,
                                                             const float* weight, float eps) {
  pdl_start();  // runtime/pdl.h: nothing in this kernel runs before the wait
  __shared__ float partial[kThreads / 32];
  const float* xr = x + int64_t(blockIdx.x) * n;
  float* yr = y + int64_t(blockIdx.x) * n;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) ss = fmaf(xr[i], xr[i], ss);
  ss = warp_sum(ss);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = ss;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) total += partial[w];
  const float inv = rms_inv(total, float(n), eps);
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    const float v = xr[i] * inv;
    yr[i] = weight ? weight[i] * v : v;
  }
}

}  // namespace

Status rmsnorm_f32(const float* x, float* y, int64_t rows, int64_t n, const float* weight, float eps,
                   cudaStream_t stream) {
  if (rows == 0) return Status::ok();
  if (rows > 0x7fffffff) return internal_error("rmsnorm: too many rows");
  const cudaError_t e = launch_pdl(rmsnorm_f32_sm90, dim3(unsigned(rows)), dim3(kThreads), 0, stream, x, y, n, weight, eps);
  return cuda_status(e, "rmsnorm_f32_sm90");
}

}  // namespace aff::cuda
