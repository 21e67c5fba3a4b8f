// The V4 sublayers on the device, each the twin of a CPU reference function
// (model/dsv4/{mhc,attention,compressor,indexer,moe}.h), reading and writing
// device buffers on the state's stream. The forward pass chains them; the op
// checker (check/op_check.h) runs each against its CPU twin.
#pragma once

#include <cstdint>

#include "affinity/status.h"
#include "backend/cuda/gpu_state.h"
#include "backend/cuda/kernels/mhc/mhc.h"
#include "backend/cuda/runtime/device_model.h"

namespace aff::cuda {

// hc_pre: x: [T, D] = sum_j pre_j h_j; leaves pre/post/comb in st.ws.
//   h: [T, hc, D] device.
Status gpu_hc_pre(const DeviceModel& m, const DeviceHc& w, GpuState& st, const float* h, int64_t T, float* x);

// hc_post with the coefficients left by the last gpu_hc_pre: h <- post*a + comb^T h.
Status gpu_hc_post(const DeviceModel& m, GpuState& st, const float* a, int64_t T, float* h);

// Final collapse (no Sinkhorn): y: [T, D] from h: [T, hc, D].
Status gpu_hc_head(const DeviceModel& m, GpuState& st, const float* h, int64_t T, float* y);

// Before a chunk at positions [pos0, pos0 + T): backs the caches for them and
// writes the chunk's StepInfo (which the kernels read) on the state's stream.
Status gpu_begin_chunk(GpuState& st, int64_t pos0, int64_t T);

// One-token steps at positions below this share a captured graph whose
// launches are sized for that range (the indexer's top-k in one block, the
// attention's key splits by the entries such a step can see); later steps
// take a graph sized for the caches' capacity.
constexpr int64_t kShortDecodePositions = 16384;

// Which of those graphs a one-token step at position pos belongs to.
int gpu_decode_shape(int64_t pos);

// What the mHC site before layer l's attention computes for that attention's
// side work at decode sizes, beside x (each saves a launch):
//  - x into the x rings of the compressors that defer a decode step's
//    projections (compressor_run); T == 1 only;
//  - the indexer's head weights (weights_proj x) as partial sums over the
//    site's blocks of channels, which the indexer's scores add up
//    (AFF_CUDA_SITE_IW=0: their own launch).
// Empty parts where the layer or the chunk has none.
struct HcSiteFeeds {
  float* ring[2] = {nullptr, nullptr};
  int rows = 0;
  const uint8_t* iw_weight = nullptr;  // [iw_heads, D] BF16
  int iw_heads = 0;
  float* iw_parts = nullptr;           // out [T, hc_decode_blocks(D), iw_heads]
};
HcSiteFeeds gpu_attention_site_feeds(const DeviceModel& m, int l, GpuState& st, int64_t T);

// One mHC site in one launch (kernels/mhc: hc_fused) for rows [first, first + T):
// when `a` is set, h <- post_prev * a + comb_prev^T h first (the previous
// sublayer's hc_post, coefficients from st.ws); then this site's coefficients
// from w (left in st.ws for the next expand) and
// x = norm_weight * rmsnorm(sum_j pre_j h_j) (raw collapse when norm_weight is null).
// head: the final collapse (w = the model's hc_head; pre only).
//   h: [first + T, hc, D]; a: [first + T, D] or null; x: [T, D].
// defer (optional): at decode sizes the site may leave its comb's Sinkhorn to
// the next launch; *defer is then that job (else empty), and the caller must
// hand it to gpu_attention / gpu_moe, which run it before anything reads comb.
// feeds: what the site also computes for the attention (gpu_attention_site_feeds; decode).
// copies: what the site keeps for a gpu_hc_site_router after it (decode).
struct HcCopies {
  float* h = nullptr;     // [T, hc, D] the site's output streams
  float* post = nullptr;  // [T, hc]
  float* comb = nullptr;  // [T, hc, hc] (a deferred comb: through the job)
};
Status gpu_hc_site(const DeviceModel& m, const DeviceHc& w, GpuState& st, float* h, const float* a, int64_t first,
                   int64_t T, bool head, const float* norm_weight, float* x, HcCombJob* defer = nullptr,
                   const HcSiteFeeds& feeds = {}, const HcCopies& copies = {});

// Whether layer l's MoE site and router run as one launch (gpu_hc_site_router)
// for a chunk of T tokens; the layer's first site must then keep its copies
// (gpu_site_copies) for it. Decode sizes, top-k or hash routing, BF16 / F32 gate.
bool gpu_site_router_takes(const DeviceModel& m, int l, int64_t T, bool no_routed);
HcCopies gpu_site_copies(GpuState& st);

// The layer's second mHC site (gpu_hc_site with a = the attention's output,
// norm_weight = ffn_norm) and the MoE router in one launch
// (kernels/moe/site_router.h): leaves the routes in st.ws for gpu_moe(...,
// routes_ready = true). tokens: [T] device ids (hash routing). The site's
// comb is finished inside the launch (no job for the next one).
// With AFF_CUDA_SITE_ROUTER=3 the gate's stream columns run earlier, right
// after the layer's first site (gpu_site_router_streams, h: its output streams,
// T, x, tokens as here), beside the attention; elsewhere that call does nothing.
Status gpu_site_router_streams(const DeviceModel& m, int l, GpuState& st, float* h, int64_t T, float* x,
                               const int32_t* tokens);
Status gpu_hc_site_router(const DeviceModel& m, int l, GpuState& st, float* h, const float* a, int64_t T,
                          float* x, const int32_t* tokens);

// Attention of layer l over x: [T, D] (after attn_norm) at positions
// [pos0, pos0 + T); appends the chunk to the layer's state; out: [T, D].
// pos0 must equal the number of positions this layer has been fed.
// job: the previous site's deferred comb (gpu_hc_site), run beside wq_a.
// feeds: what the site before computed for it (its feeds).
Status gpu_attention(const DeviceModel& m, int l, GpuState& st, const float* x, int64_t T, int64_t pos0,
                     float* out, const HcCombJob& job = {}, const HcSiteFeeds& feeds = {});

// MoE of layer l: out: [T, D] from x: [T, D] (after ffn_norm); tokens: [T]
// device ids (hash routing). no_routed: shared expert only.
// job: the previous site's deferred comb, run beside the router (or on its
// own). routes_ready: the routes are already in st.ws (gpu_hc_site_router),
// no router launch.
Status gpu_moe(const DeviceModel& m, int l, GpuState& st, const int32_t* tokens, const float* x, int64_t T,
               bool no_routed, float* out, const HcCombJob& job = {}, bool routes_ready = false);

// Decode-sized chunks, at the start of layer l: asks L2 for the query path's
// weights (wq_a, wkv, wq_b) on st.ahead while the mHC site, which reads
// almost nothing from HBM, runs on st.stream. gpu_prefetch_join puts the
// step's stream after the prefetches (once, at the end of the layers).
Status gpu_prefetch_query_weights(const DeviceModel& m, int l, GpuState& st, int64_t T);
Status gpu_prefetch_join(GpuState& st);

}  // namespace aff::cuda
