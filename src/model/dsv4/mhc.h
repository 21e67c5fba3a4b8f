// Manifold-constrained hyper-connections (mHC): the residual is hc_mult
// parallel streams per token; each sublayer collapses them into one input
// ("pre"), and expands its output back while mixing the old streams through a
// doubly-stochastic matrix ("post", "comb"). All math is float32.
#pragma once

#include <cstdint>
#include <vector>

#include "model/dsv4/config.h"
#include "model/dsv4/weights.h"

namespace aff::dsv4 {

// Per-token mixing coefficients of one mHC site for T tokens.
struct HcMix {
  std::vector<float> post;  // [T, hc]: weight of the sublayer output in output stream k
  std::vector<float> comb;  // [T, hc, hc]: comb[j][k] = weight of input stream j in output stream k
};

// Sinkhorn projection of c: [n, n] row-major logits, in place: row softmax,
// + eps, then column normalisation, then (iters - 1) times row then column
// normalisation; every denominator gets + eps.
void hc_sinkhorn(float* c, int n, int iters, float eps);

// The "pre" half of a site.
//   h: [T, hc, D] streams; x: [T, D] receives the collapsed sublayer input
//   sum_j pre[j] * h[j]; mix receives post and comb for hc_post.
void hc_pre(const ModelConfig& cfg, const HcWeights& w, const float* h, int64_t T, float* x,
            HcMix& mix);

// The "post" half: h[k] <- post[k] * a + sum_j comb[j][k] * h[j], in place.
//   a: [T, D] sublayer output; h: [T, hc, D].
void hc_post(const ModelConfig& cfg, const HcMix& mix, const float* a, int64_t T, float* h);

// Final collapse before the output norm (hc_head_*: fn [hc, hc*D], base [hc],
// scale [1]); no Sinkhorn, no post. h: [T, hc, D]; y: [T, D].
void hc_head(const ModelConfig& cfg, const HcWeights& w, const float* h, int64_t T, float* y);

}  // namespace aff::dsv4
