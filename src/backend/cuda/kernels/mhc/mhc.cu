// mHC kernels: hc_coeffs_f32_sm90 (one thread per token; Sinkhorn on the tiny
// hc x hc matrix in registers/local memory), hc_collapse_f32_sm90 and
// hc_expand_f32_sm90 (one thread per (token, channel)).
#include "backend/cuda/kernels/mhc/mhc.h"
#include "backend/cuda/runtime/cuda_check.h"

namespace aff::cuda {
namespace {

constexpr int kMaxHc = 8;

__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

__global__ void hc_coeffs_f32_sm90(HcCoeffArgs a) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= a.T) return;
  const int hc = a.hc;
  const int n_mix = a.head ? hc : (2 + hc) * hc;
  const float* m = a.m + t * n_mix;
  for (int j = 0; j < hc; ++j) a.pre[t * hc + j] = sigmoidf_(m[j] * a.scale[0] + a.base[j]) + a.eps;
  if (a.head) return;
  for (int j = 0; j < hc; ++j) a.post[t * hc + j] = 2.0f * sigmoidf_(m[hc + j] * a.scale[1] + a.base[hc + j]);

  float c[kMaxHc * kMaxHc];
  for (int i = 0; i < hc * hc; ++i) c[i] = m[2 * hc + i] * a.scale[2] + a.base[2 * hc + i];
  // Row softmax + eps, column normalisation, then (iters - 1) x (rows, columns);
  // every denominator + eps (as the reference).
  for (int j = 0; j < hc; ++j) {
    float mx = c[j * hc];
    for (int k = 1; k < hc; ++k) mx = fmaxf(mx, c[j * hc + k]);
    float s = 0.0f;
    for (int k = 0; k < hc; ++k) {
      c[j * hc + k] = expf(c[j * hc + k] - mx);
      s += c[j * hc + k];
    }
    const float inv = 1.0f / s;
    for (int k = 0; k < hc; ++k) c[j * hc + k] = c[j * hc + k] * inv + a.eps;
  }
  for (int it = 0; it < max(a.sinkhorn_iters, 1); ++it) {  // the reference always normalises columns once
    if (it > 0) {
      for (int j = 0; j < hc; ++j) {
        float s = 0.0f;
        for (int k = 0; k < hc; ++k) s += c[j * hc + k];
        for (int k = 0; k < hc; ++k) c[j * hc + k] /= s + a.eps;
      }
    }
    for (int k = 0; k < hc; ++k) {
      float s = 0.0f;
      for (int j = 0; j < hc; ++j) s += c[j * hc + k];
      for (int j = 0; j < hc; ++j) c[j * hc + k] /= s + a.eps;
    }
  }
  for (int i = 0; i < hc * hc; ++i) a.comb[t * hc * hc + i] = c[i];
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
