// The MoE sublayer's mHC site and its router in one decode launch, the
// router's gate running beside the site instead of after it.
//
// Why: at decode the site (a grid barrier and a handful of dependent steps)
// and the router (a GEMV, a ticket and a top-k) are two latency-bound steps
// in a row on the critical path. The gate's logits are linear in the site's
// x, and x is a linear mix of vectors the site only reads:
//   x_n  = g * inv * sum_k pre[k] h2[k]          (the site's collapse and norm)
//   h2[k] = post1[k] a + sum_j comb1[j][k] h1[j]  (the site's expand)
// so  gate . x_n = inv * (cf[0] P[a] + sum_j cf[1 + j] P[h1[j]]),  with
//   P[v] = gate . (g * v),  cf[0] = sum_k pre[k] post1[k],
//   cf[1 + j] = sum_k pre[k] comb1[j][k].
// The five P columns need nothing the site computes: the router blocks
// stream the gate against a, h1 and g while the site blocks run, and the
// last block to finish (a ticket over the router blocks and each token's
// site block 0, which publishes pre and inv) combines them with the site's
// coefficients and routes every token (route_token, as router_gate_topk),
// and finishes the site's deferred comb in its other warps.
// The logits are the same sums reassociated: they agree with the router
// launch to f32 rounding, not bit for bit.
//
// The site overwrites h, post and comb in place, so the gate reads copies
// the first site of the layer keeps (HcFusedArgs::h_copy / post_copy /
// comb_copy, HcCombJob::copy).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "affinity/status.h"
#include "backend/cuda/kernels/mhc/mhc.h"
#include "backend/cuda/kernels/moe/moe.h"
#include "backend/cuda/runtime/device_weights.h"

namespace aff::cuda {

constexpr int64_t kSiteRouterMaxT = 2;  // tokens a launch takes (the gate's 5 columns per token)
constexpr int kSiteRouterCols = 5;      // P columns per token: a, then the previous site's 4 streams

struct SiteRouterArgs {
  HcFusedArgs site;                 // the decode site: a, x_norm and x_inv set, hc 4, 24 mixes
  RouterArgs router;                // logits [T, E], ids / weights [T, k] out
  const uint8_t* gate = nullptr;    // [E, D] BF16 or F32
  bool gate_bf16 = true;
  const float* h_prev = nullptr;    // [T, 4, D] the previous site's output streams (its h_copy)
  const float* post_prev = nullptr; // [T, 4]    its post (post_copy)
  const float* comb_prev = nullptr; // [T, 4, 4] its finished comb (comb_copy)
  // The site's deferred comb (site.defer_comb): its Sinkhorn runs in the
  // finishing block beside the routing, so nothing after the launch waits for
  // it. comb == nullptr when the site finishes comb itself.
  HcCombJob comb_job;
  float* parts = nullptr;           // [T, kSiteRouterCols, E] scratch: the gate's partial sums
  unsigned* ticket = nullptr;       // u32, zero between launches (left zero)
};

// Whether site_router takes this site and router (decode sizes, hc 4, 24
// mixes, a previous sublayer output to expand, a BF16 / F32 gate of [E, D]
// with 16-byte aligned rows, E <= 256).
bool site_router_supported(const HcFusedArgs& site, const RouterArgs& r, const DeviceLinear& gate);
// The shape part of it alone (T tokens, hidden size D, hc streams).
bool site_router_shape_ok(int64_t T, int64_t D, int hc, const RouterArgs& r, const DeviceLinear& gate);

Status site_router(const SiteRouterArgs& a, cudaStream_t stream);

// The same work as two launches: the gate blocks on gate_stream, the site's on
// site_stream (both after the inputs are ready; they share the ticket, so
// whichever ends last routes). The routes are ready once both have run;
// what reads only x (the shared expert) may follow the site launch alone.
// streams_done: the stream columns are already in parts (site_router_streams
// ran), so the gate blocks compute a's column only.
Status site_router_split(const SiteRouterArgs& a, cudaStream_t site_stream, cudaStream_t gate_stream,
                         bool streams_done = false);

// The four stream columns alone (P[h1[j]]: they read only the previous site's
// output streams, a.h_prev, and the gate), as a launch that can run long
// before the site, beside the attention: the streams are then still in h
// (no copy needed), and the site must not start before it ends (it
// overwrites h). Only a.h_prev, a.site (T, D, x_norm), a.router (T, E), the
// gate and a.parts are read.
Status site_router_streams(const SiteRouterArgs& a, cudaStream_t stream);

}  // namespace aff::cuda
