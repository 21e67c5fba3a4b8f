// Manifold-constrained hyper-connections on the device: the whole site in one
// launch (hc_fused), and the plain expand the op checker compares on its own.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "affinity/status.h"
#include "backend/cuda/runtime/step_info.h"

namespace aff::cuda {

// h[t, k] <- post[t, k] * a[t] + sum_j comb[t, j, k] * h[t, j], in place.
//   h: [T, hc, D]; a: [T, D]; post: [T, hc]; comb: [T, hc, hc].
Status hc_expand(float* h, const float* a, const float* post, const float* comb, int64_t T, int hc,
                 int64_t D, cudaStream_t stream);

// One mHC site in one launch (expand + rmsnorm + mixes GEMV + coefficients +
// collapse + sublayer norm):
//   1. if `a` is set, expand the previous sublayer's output into h in place
//      (h[k] <- post_prev[k] * a + sum_j comb_prev[j][k] * h[j]);
//   2. m = fn . rmsnorm_unweighted(flatten(h))  (dot first, scaled by the
//      norm after: the same sums, reassociated);
//   3. coefficients (pre, and post/comb for a site);
//   4. x = rmsnorm(sum_j pre[j] h[j]) * x_norm.
// Steps 1-2 are spread over blocks of 128 channels; the last block of each
// token (prefill with hc 4: of each tile of 16 tokens) to finish (ticket
// counter) reduces the partial sums in block order (so the result does not
// depend on scheduling) and does 3-4. Decode (T <= kHcSmallT, hc 4): all
// blocks of a token meet at a barrier and each finishes its own channels.
struct HcFusedArgs {
  float* h = nullptr;              // [T, hc, D] streams, updated in place when `a` is set
  const float* a = nullptr;        // [T, D] previous sublayer output, or null (no expand)
  const uint8_t* fn = nullptr;     // [n_mix, hc*D] mixes matrix (f32, bf16 or f16)
  int fn_dtype = 0;                // 0 f32, 1 bf16, 2 f16
  const float* base = nullptr;     // [n_mix]
  const float* scale = nullptr;    // [3] (site) or [1] (head)
  int64_t T = 0;
  int hc = 4;
  int64_t D = 0;
  bool head = false;               // final collapse: pre only
  int sinkhorn_iters = 20;
  float hc_eps = 1e-6f;
  float norm_eps = 1e-6f;          // rms_norm_eps (flatten norm and x's norm)
  float* post = nullptr;           // [T, hc]      in: previous site's (if a); out: this site's
  float* comb = nullptr;           // [T, hc, hc]  likewise
  float* pre = nullptr;            // [T, hc] out
  const float* x_norm = nullptr;   // [D] weight of x's rmsnorm, or null (x is then the raw collapse)
  float* x = nullptr;              // [T, D] out
  float* partials = nullptr;       // scratch [T, hc_fused_blocks(D), n_mix + 1 + hc*(hc+1)/2]
  unsigned* tickets = nullptr;     // [2*T] zero before the first launch; left zero after each
  // Decode: leave comb as its logits (m * scale[2] + base) for an HcCombJob to
  // finish (the Sinkhorn is half the decode site's latency and only the next
  // site reads comb, so the launch after this site runs it beside its own work).
  bool defer_comb = false;
  // Decode, one token: x is also written to row step->pos0 % x_ring_rows of
  // each non-null x_ring ([x_ring_rows, D]: the x rings of the layer's
  // compressors whose projections wait for the block's end), which saves
  // those compressors a store launch each. Only the decode variant does it.
  const StepInfo* step = nullptr;
  float* x_ring[2] = {nullptr, nullptr};
  int x_ring_rows = 0;
  // Decode only, each optional. The site whose successor's router gate runs
  // beside that successor (moe/site_router.h) keeps copies of what it hands
  // on, which the successor overwrites in place while the gate still reads
  // them: the expanded streams (h_copy [T, hc, D]), post (post_copy [T, hc])
  // and comb (comb_copy [T, hc, hc]; a deferred comb reaches it through
  // HcCombJob::copy). x_inv [T]: the inverse rms of x's norm (the factor by
  // which the collapse is scaled before x_norm), for the gate's partial sums.
  float* h_copy = nullptr;
  float* post_copy = nullptr;
  float* comb_copy = nullptr;
  float* x_inv = nullptr;
  // Decode only, optional: the next attention's indexer head weights
  // (weights_proj x) as partial sums over each block's channels, so no launch
  // of their own precedes the indexer's scores (which add them up).
  const uint8_t* iw_weight = nullptr;  // [iw_heads, D] BF16
  int iw_heads = 0;                    // hc_site_iw_supported
  float* iw_parts = nullptr;           // out [T, hc_decode_blocks(D), iw_heads]
};

// The Sinkhorn of a decode site whose comb was deferred (HcFusedArgs::
// defer_comb): comb [T, hc, hc] holds the logits and is turned, in place, into
// the site's comb: row softmax + eps, then the column / row normalisations, as
// hc_coefficients. A launch that takes the job (gemv_mma_pair, router_gate_topk)
// runs it in one extra block after its wait; hc_comb_run is the launch of its
// own for a consumer that cannot. comb == nullptr: no job.
struct HcCombJob {
  float* comb = nullptr;
  int64_t T = 0;
  int hc = 0, iters = 0;
  float eps = 0.0f;
  float* copy = nullptr;  // optional second home of the result (HcFusedArgs::comb_copy)
};
Status hc_comb_run(const HcCombJob& j, cudaStream_t stream);

// Up to this many tokens (hc 4) a launch uses the decode variant: all blocks
// of a token resident at once, meeting at one barrier. Above it (hc 4) the
// prefill variant runs when h, a, fn, x and x_norm are 16-byte aligned, D is
// a multiple of 8 (of 4 for an f32 fn) and at most 8192; anything else takes
// the generic one-token-per-block kernel.
constexpr int64_t kHcSmallT = 8;
// Blocks of a token in the decode variant (channels per block: its threads).
int hc_decode_blocks(int64_t D);
// Whether the decode variant can compute the indexer's head weights
// (HcFusedArgs::iw_weight): whole blocks of channels, at most 64 heads.
bool hc_site_iw_supported(int64_t D, int heads);
int hc_fused_blocks(int64_t D);
Status hc_fused(const HcFusedArgs& a, cudaStream_t stream);

}  // namespace aff::cuda
