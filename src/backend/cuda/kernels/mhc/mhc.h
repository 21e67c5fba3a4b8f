// Manifold-constrained hyper-connections on the device. The mixes
// m = fn . rmsnorm(flatten(h)) are a norm + GEMV done by the caller; these
// kernels turn m into coefficients (sigmoids, Sinkhorn) and apply them.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "affinity/status.h"

namespace aff::cuda {

struct HcCoeffArgs {
  const float* m = nullptr;     // [T, n_mix] mixes, n_mix = (2+hc)*hc (site) or hc (head)
  const float* base = nullptr;  // [n_mix]
  const float* scale = nullptr; // [3] (site) or [1] (head)
  int64_t T = 0;
  int hc = 4;
  int sinkhorn_iters = 20;
  float eps = 1e-6f;
  bool head = false;            // final collapse: pre only, one scale
  float* pre = nullptr;         // out [T, hc]
  float* post = nullptr;        // out [T, hc] (site only)
  float* comb = nullptr;        // out [T, hc, hc], comb[j][k] = input stream j -> output k (site only)
};

// pre = sigmoid(m*s0 + b) + eps; post = 2 sigmoid(m*s1 + b); comb = Sinkhorn(m*s2 + b).
Status hc_coeffs(const HcCoeffArgs& a, cudaStream_t stream);

// x[t] = sum_j pre[t, j] * h[t, j]. h: [T, hc, D]; pre: [T, hc]; x: [T, D].
Status hc_collapse(const float* h, const float* pre, int64_t T, int hc, int64_t D, float* x,
                   cudaStream_t stream);

// h[t, k] <- post[t, k] * a[t] + sum_j comb[t, j, k] * h[t, j], in place.
//   h: [T, hc, D]; a: [T, D]; post: [T, hc]; comb: [T, hc, hc].
Status hc_expand(float* h, const float* a, const float* post, const float* comb, int64_t T, int hc,
                 int64_t D, cudaStream_t stream);

}  // namespace aff::cuda
