// One token's mHC coefficients from its mixes, shared by the plain and the
// fused kernels (one home for the arithmetic the reference defines).
#pragma once

#include "backend/cuda/kernels/mhc/mhc.h"

namespace aff::cuda {

constexpr int kMaxHc = 8;

__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

// m: [n_mix] mixes (n_mix = hc for the head, (2+hc)*hc for a site);
// pre = sigmoid(m*s0 + b) + eps; post = 2 sigmoid(m*s1 + b); comb = Sinkhorn(m*s2 + b).
// pre: [hc]; post: [hc] and comb: [hc, hc] (site only; comb[j][k] = stream j -> k).
__device__ inline void hc_coefficients(const float* m, const float* base, const float* scale, int hc, int iters,
                                       float eps, bool head, float* pre, float* post, float* comb) {
  for (int j = 0; j < hc; ++j) pre[j] = sigmoidf_(m[j] * scale[0] + base[j]) + eps;
  if (head) return;
  for (int j = 0; j < hc; ++j) post[j] = 2.0f * sigmoidf_(m[hc + j] * scale[1] + base[hc + j]);

  float c[kMaxHc * kMaxHc];
  for (int i = 0; i < hc * hc; ++i) c[i] = m[2 * hc + i] * scale[2] + base[2 * hc + i];
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
    for (int k = 0; k < hc; ++k) c[j * hc + k] = c[j * hc + k] * inv + eps;
  }
  for (int it = 0; it < max(iters, 1); ++it) {  // the reference always normalises columns once
    if (it > 0) {
      for (int j = 0; j < hc; ++j) {
        float s = 0.0f;
        for (int k = 0; k < hc; ++k) s += c[j * hc + k];
        for (int k = 0; k < hc; ++k) c[j * hc + k] /= s + eps;
      }
    }
    for (int k = 0; k < hc; ++k) {
      float s = 0.0f;
      for (int j = 0; j < hc; ++j) s += c[j * hc + k];
      for (int j = 0; j < hc; ++j) c[j * hc + k] /= s + eps;
    }
  }
  for (int i = 0; i < hc * hc; ++i) comb[i] = c[i];
}

// The comb part of hc_coefficients_warp for one lane: c is the lane's logit
// (element (lane / hc, lane % hc) of m * scale[2] + base; lanes >= hc * hc
// pass 0 and get garbage back); returns the lane's Sinkhorn result. Called by
// all 32 lanes. Sums run over k (or j) in index order, as in the sequential form.
__device__ __forceinline__ float hc_sinkhorn_lane(float c, int hc, int iters, float eps) {
  const int lane = threadIdx.x & 31;
  const int n = hc * hc;
  const bool own = lane < n;
  const int j = own ? lane / hc : 0, k = own ? lane % hc : 0;
  // Row softmax + eps.
  float mx = __shfl_sync(0xffffffffu, c, j * hc);
  for (int q = 1; q < hc; ++q) mx = fmaxf(mx, __shfl_sync(0xffffffffu, c, j * hc + q));
  c = expf(c - mx);
  float s = 0.0f;
  for (int q = 0; q < hc; ++q) s += __shfl_sync(0xffffffffu, c, j * hc + q);
  c = c * (1.0f / s) + eps;
  for (int it = 0; it < max(iters, 1); ++it) {  // the reference always normalises columns once
    if (it > 0) {
      s = 0.0f;
      for (int q = 0; q < hc; ++q) s += __shfl_sync(0xffffffffu, c, j * hc + q);
      c /= s + eps;
    }
    s = 0.0f;
    for (int q = 0; q < hc; ++q) s += __shfl_sync(0xffffffffu, c, q * hc + k);
    c /= s + eps;
  }
  return c;
}

// Warp-parallel twin of hc_coefficients for hc * hc <= 32, called by all 32
// lanes of one warp. One thread doing the 2 x iters dependent normalisation
// passes (each an IEEE division per element) took >10 us per site, the largest
// single cost of a decode step; here lane l owns comb element (l / hc, l % hc)
// and a pass is hc shuffles, one sum and one division.
// sinkhorn == false leaves comb as its logits (m * scale[2] + base) for
// hc_sinkhorn_lane to finish later (a deferred comb, HcCombJob).
// m: [n_mix] (shared or registers of any lane: read by index); pre, post: [hc];
// comb: [hc, hc] (outputs, any memory the warp can write).
__device__ inline void hc_coefficients_warp(const float* m, const float* base, const float* scale, int hc,
                                            int iters, float eps, bool head, float* pre, float* post,
                                            float* comb, bool sinkhorn = true) {
  const int lane = threadIdx.x & 31;
  if (lane < hc) {
    pre[lane] = sigmoidf_(m[lane] * scale[0] + base[lane]) + eps;
    if (!head) post[lane] = 2.0f * sigmoidf_(m[hc + lane] * scale[1] + base[hc + lane]);
  }
  if (head) return;
  const bool own = lane < hc * hc;
  float c = own ? m[2 * hc + lane] * scale[2] + base[2 * hc + lane] : 0.0f;
  if (sinkhorn) c = hc_sinkhorn_lane(c, hc, iters, eps);
  if (own) comb[lane] = c;
}

// Token t of an HcCombJob, by the calling warp (all 32 lanes), in place (and
// into job.copy when set). The logits are read from L2: they may come from
// another block of the same launch.
__device__ inline void hc_comb_job_token(const HcCombJob& job, int64_t t) {
  const int lane = threadIdx.x & 31, n = job.hc * job.hc;
  float* cm = job.comb + t * n;
  const float c = hc_sinkhorn_lane(lane < n ? __ldcg(cm + lane) : 0.0f, job.hc, job.iters, job.eps);
  if (lane < n) cm[lane] = c;
  if (job.copy != nullptr && lane < n) job.copy[t * n + lane] = c;
}

// Runs an HcCombJob with the calling block (any number of whole warps): warp
// w finishes tokens w, w + warps, ... in place.
__device__ inline void hc_comb_job_run(const HcCombJob& job) {
  const int warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int64_t t = warp; t < job.T; t += warps) hc_comb_job_token(job, t);
}

}  // namespace aff::cuda
