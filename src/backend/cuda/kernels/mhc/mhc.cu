// mHC kernels: hc_coeffs_f32_sm90 (one thread per token; Sinkhorn on the tiny
// hc x hc matrix in registers/local memory), hc_collapse_f32_sm90 and
// hc_expand_f32_sm90 (one thread per (token, channel)).
#include "backend/cuda/kernels/mhc/mhc.h"
#include "backend/cuda/kernels/mhc/mhc_coeffs.cuh"
#include "backend/cuda/runtime/cuda_check.h"

namespace aff::cuda {
namespace {

__global__ void hc_coeffs_f32_sm90(HcCoeffArgs a) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= a.T) return;
  const int hc = a.hc;
  const int n_mix = a.head ? hc : (2 + hc) * hc;
  hc_coefficients(a.m + t * n_mix, a.base, a.scale, hc, a.sinkhorn_iters, a.eps, a.head, a.pre + t * hc,
                  a.head ? nullptr : a.post + t * hc, a.head ? nullptr : a.comb + t * hc * hc);
}

__global__ void hc_collapse_f32_sm90(const float* h, const float* pre, int64_t T, int hc, int64_t D,
                                     float* x) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= T * D) return;
  const int64_t t = i / D, d = i % D;
  float s = 0.0f;
  for (int j = 0; j < hc; ++j) s = fmaf(pre[t * hc + j], h[(t * hc + j) * D + d], s);
  x[i] = s;
}

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

Status hc_coeffs(const HcCoeffArgs& a, cudaStream_t stream) {
  if (a.hc < 1 || a.hc > kMaxHc) return unsupported("mHC: hc_mult above 8 is not supported on the GPU");
  if (a.T == 0) return Status::ok();
  hc_coeffs_f32_sm90<<<blocks_for(a.T, 64), 64, 0, stream>>>(a);
  return launch_status("hc_coeffs_f32_sm90");
}

Status hc_collapse(const float* h, const float* pre, int64_t T, int hc, int64_t D, float* x,
                   cudaStream_t stream) {
  if (T * D == 0) return Status::ok();
  hc_collapse_f32_sm90<<<blocks_for(T * D, 256), 256, 0, stream>>>(h, pre, T, hc, D, x);
  return launch_status("hc_collapse_f32_sm90");
}

Status hc_expand(float* h, const float* a, const float* post, const float* comb, int64_t T, int hc,
                 int64_t D, cudaStream_t stream) {
  if (hc > kMaxHc) return unsupported("mHC: hc_mult above 8 is not supported on the GPU");
  if (T * D == 0) return Status::ok();
  hc_expand_f32_sm90<<<blocks_for(T * D, 256), 256, 0, stream>>>(h, a, post, comb, T, hc, D);
  return launch_status("hc_expand_f32_sm90");
}

}  // namespace aff::cuda
