// hc_expand_f32_sm90: one thread per (token, channel). The forward pass does
// this inside hc_fused (mhc_fused.cu); the op checker checks hc_post alone.
#include "backend/cuda/kernels/mhc/mhc.h"
#include "backend/cuda/kernels/mhc/mhc_coeffs.cuh"
#include "backend/cuda/runtime/cuda_check.h"

namespace aff::cuda {
namespace {

__global__ void hc_expand_f32_sm90(float* h, const float* a, const float* post, const float* comb,
                                   int64_t T, int hc, int64_t D) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= T * D) return;
  const int64_t t = i / D, d = i % D;
  float old[kMaxHc];
  for (int j = 0; j < hc; ++j) old[j] = h[(t * hc + j) * D + d];
  const float av = a[i];
  const float* c = comb + t * hc * hc;
  for (int k = 0; k < hc; ++k) {
    float o = post[t * hc + k] * av;
    for (int j = 0; j < hc; ++j) o = fmaf(c[j * hc + k], old[j], o);
    h[(t * hc + k) * D + d] = o;
  }
}

unsigned blocks_for(int64_t n, int threads) { return unsigned((n + threads - 1) / threads); }

}  // namespace

Status hc_expand(float* h, const float* a, const float* post, const float* comb, int64_t T, int hc,
                 int64_t D, cudaStream_t stream) {
  if (hc > kMaxHc) return unsupported("mHC: hc_mult above 8 is not supported on the GPU");
  if (T * D == 0) return Status::ok();
  hc_expand_f32_sm90<<<blocks_for(T * D, 256), 256, 0, stream>>>(h, a, post, comb, T, hc, D);
  return launch_status("hc_expand_f32_sm90");
}

}  // namespace aff::cuda
