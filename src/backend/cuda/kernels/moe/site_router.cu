// site_router_sm90: the decode mHC site's blocks (hc_site::site_decode_body)
// and the router's gate blocks in one grid; see site_router.h for the algebra.
#include <algorithm>

#include "backend/cuda/kernels/common/decode.cuh"
#include "backend/cuda/kernels/mhc/mhc_site_decode.cuh"
#include "backend/cuda/kernels/moe/route_select.cuh"
#include "backend/cuda/kernels/moe/site_router.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/pdl.h"

namespace aff::cuda {
namespace {

constexpr int kThreads = hc_site::kSmallThreads;  // both roles: the site body's block size
constexpr int kWarps = kThreads / 32;
// Two warps per gate row (each half its columns: 2,048 BF16 values at V4's
// D, one batch of 16-byte loads per lane), two rows per block: V4's 256 rows
// over 128 blocks beside the site's 32.
constexpr int kSplit = 2;
constexpr int kRows = kWarps / kSplit;
constexpr int kMaxT = int(kSiteRouterMaxT);
constexpr int kCols = kSiteRouterCols;
static_assert(kCols == 5, "a and four streams (hc 4)");
static_assert(2 * kMaxT <= kWarps, "the finishing block routes and finishes comb with one warp per token each");

__host__ __device__ constexpr int gate_blocks(int E) { return (E + kRows - 1) / kRows; }

// Shared memory: the site body's staged partials, or the finisher's per-token
// logits, scores and scratch ([3, E] floats per token), whichever is larger.
size_t site_router_smem(int nb, int E, int64_t T) {
  const size_t site = size_t(nb) * (24 + 10) * sizeof(float);
  const size_t fin = size_t(T) * 3 * size_t(E) * sizeof(float);
  return std::max(site, fin);
}

// The last arriver: token t's logits from the partials and the site's pre /
// inv, then the picks (warp t; route_token as router_gate_topk's).
__device__ void finish_routing(const SiteRouterArgs& a, float* smem, int32_t (*sel)[32], const LaneBias* bias) {
  const RouterArgs& r = a.router;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, E = r.E;
  const int T = int(r.T);
  // Warps [T, 2T): the site's deferred Sinkhorn (its comb logits are out
  // before site block 0's ticket), beside the routing of warps [0, T).
  if (warp >= T) {
    if (a.comb_job.comb != nullptr && warp - T < a.comb_job.T) hc_comb_job_token(a.comb_job, warp - T);
    return;
  }
  const int t = warp;
  // cf[0] = sum_k pre[k] post1[k]; cf[1 + j] = sum_k pre[k] comb1[j][k] (k in order).
  float pre[4], cf[kCols];
#pragma unroll
  for (int k = 0; k < 4; ++k) pre[k] = __ldcg(a.site.pre + t * 4 + k);
  cf[0] = 0.0f;
#pragma unroll
  for (int k = 0; k < 4; ++k) cf[0] = fmaf(pre[k], a.post_prev[t * 4 + k], cf[0]);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    cf[1 + j] = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; ++k) cf[1 + j] = fmaf(pre[k], a.comb_prev[t * 16 + j * 4 + k], cf[1 + j]);
  }
  const float inv = __ldcg(a.site.x_inv + t);
  float* lg = smem + size_t(t) * 3 * E;
  const float* parts = a.parts + int64_t(t) * kCols * E;
  for (int e = lane; e < E; e += 32) {
    float v = 0.0f;
#pragma unroll
    for (int c = 0; c < kCols; ++c) v = fmaf(cf[c], __ldcg(parts + int64_t(c) * E + e), v);
    v *= inv;
    lg[e] = v;
    r.logits[int64_t(t) * E + e] = v;
  }
  __syncwarp();
  route_token(r, t, lg, lg + E, lg + 2 * E, sel[t], r.ids + int64_t(t) * r.k, r.weights + int64_t(t) * r.k, bias);
}

// Blocks [0, nb) of a grid row are the site's (nb = 0: a launch of gate
// blocks only), the rest gate blocks (none in a launch of the site only).
// The gate blocks compute P columns [kC0, kC0 + kNC) (site_router.h); the
// stream columns alone (kC0 = 1) are a launch of their own before the site,
// which writes its partials and takes no part in the ticket.
template <int FNT, bool kBf16, int kC0, int kNC>
__global__ void __launch_bounds__(kThreads) site_router_sm90(SiteRouterArgs a, int nb) {
  constexpr bool kArrives = kC0 == 0;
  extern __shared__ float smem[];
  __shared__ float slice_sum[kWarps][kCols * kMaxT];
  __shared__ int32_t sel[kMaxT][32];
  __shared__ bool last;
  const RouterArgs& r = a.router;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int T = int(r.T);
  LaneBias bias;
  bias.ok = false;
  if (int(blockIdx.x) < nb) {
    hc_site::site_decode_body<4, 24, FNT>(a.site, nb);
    if (blockIdx.x != 0) return;  // block 0 (warp 0) wrote this token's pre and inv: it arrives below
  } else {
    if (blockIdx.y != 0) return;  // the gate blocks serve every token from grid row 0
    const int gb = int(blockIdx.x) - nb;
    const int e = gb * kRows + warp / kSplit, slice = warp % kSplit;
    GateSlice<kBf16, kSplit> gs(a.gate, a.site.D, e, e < r.E, slice);
    gs.prefetch(lane);  // weights: before the wait
    bias = lane_bias(r);
    pdl_launch_dependents();
    pdl_wait();  // a is the previous kernel's output; h_prev, post_prev, comb_prev earlier ones'
    float acc[kCols * kMaxT];
    gs.template dot_streams<kMaxT, kC0, kNC>(a.site.a, a.h_prev, a.site.x_norm, a.site.D, T, lane, acc);
#pragma unroll
    for (int i = 0; i < kCols * kMaxT; ++i)
      if (lane == 0 && i < kCols * T) slice_sum[warp][i] = acc[i];
    __syncthreads();
    // A row's slices added in slice order, a thread per (row, column).
    if (int(threadIdx.x) < kRows * kCols * T) {
      const int rr = threadIdx.x / (kCols * T), col = threadIdx.x % (kCols * T), er = gb * kRows + rr;
      float v = 0.0f;
#pragma unroll
      for (int q = 0; q < kSplit; ++q) v += slice_sum[rr * kSplit + q][col];
      // col = kCols * t + c -> parts[t][c][er]
      const int c = col % kCols;
      if (er < r.E && c >= kC0 && c < kC0 + kNC) a.parts[int64_t(col) * r.E + er] = v;
    }
    if constexpr (!kArrives) return;
  }
  // Ticket over the gate blocks and each token's site block 0 (the usual
  // last-block pattern: every writer fences, the block syncs, one thread
  // counts; the last one fences again and reads).
  const unsigned arrivals = unsigned(gate_blocks(r.E) + T);
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(a.ticket, 1u) == arrivals - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (threadIdx.x == 0) *a.ticket = 0u;
  finish_routing(a, smem, sel, bias.ok ? &bias : nullptr);
}

}  // namespace

bool site_router_shape_ok(int64_t T, int64_t D, int hc, const RouterArgs& r, const DeviceLinear& gate) {
  const bool bf16 = gate.format == DevFormat::kBF16, f32 = gate.format == DevFormat::kF32;
  const int nb = hc_decode_blocks(D);
  return (bf16 || f32) && T >= 1 && T <= kSiteRouterMaxT && r.T == T && hc == 4 && r.E >= 1 &&
         r.E <= 32 * kTopkPerLane && r.k >= 1 && r.k <= 32 && r.k <= r.E && gate.out == r.E && gate.in == D &&
         D % (4 * 32 * kSplit) == 0 && reinterpret_cast<uintptr_t>(gate.weight) % 16 == 0 &&
         site_router_smem(nb, r.E, T) <= 48 * 1024;
}

bool site_router_supported(const HcFusedArgs& s, const RouterArgs& r, const DeviceLinear& gate) {
  return site_router_shape_ok(s.T, s.D, s.hc, r, gate) && !s.head && s.a != nullptr && s.x_norm != nullptr &&
         s.x_inv != nullptr && s.fn_dtype >= 0 && s.fn_dtype <= 2;
}

namespace {

// Which P columns a launch's gate blocks compute.
enum class Cols { kAll, kA, kStreams };

// site / gate: which roles this launch's grid holds.
Status launch_site_router(const SiteRouterArgs& a, bool site, bool gate, Cols cols, cudaStream_t stream) {
  const HcFusedArgs& s = a.site;
  const int nb = hc_decode_blocks(s.D);
  if (cols == Cols::kStreams && site) return internal_error("site_router: the stream columns run before the site");
  if ((gate && cols != Cols::kA && a.h_prev == nullptr) || a.post_prev == nullptr || a.comb_prev == nullptr ||
      a.parts == nullptr || a.ticket == nullptr || a.router.logits == nullptr)
    return internal_error("site_router: missing buffers");
  if (s.x_ring_rows > 0) return internal_error("site_router: the MoE site writes no x rings");
  for (const void* p : {static_cast<const void*>(s.a), static_cast<const void*>(a.h_prev),
                        static_cast<const void*>(s.x_norm)})
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return internal_error("site_router: inputs must be 16-byte aligned");
  if (s.a == nullptr && cols != Cols::kStreams) return internal_error("site_router: no sublayer output");
  const int site_blocks = site ? nb : 0;
  const dim3 grid(unsigned(site_blocks + (gate ? gate_blocks(a.router.E) : 0)), unsigned(site ? s.T : 1));
  const dim3 block(kThreads);
  const size_t smem = site_router_smem(nb, a.router.E, s.T);
  cudaError_t e = cudaErrorInvalidValue;
#define AFF_SITE_ROUTER_COLS(FNT_, BF16_)                                                                   \
  switch (cols) {                                                                                           \
    case Cols::kAll: e = launch_pdl(site_router_sm90<FNT_, BF16_, 0, 5>, grid, block, smem, stream, a, site_blocks); break; \
    case Cols::kA: e = launch_pdl(site_router_sm90<FNT_, BF16_, 0, 1>, grid, block, smem, stream, a, site_blocks); break;   \
    case Cols::kStreams:                                                                                    \
      e = launch_pdl(site_router_sm90<FNT_, BF16_, 1, 4>, grid, block, smem, stream, a, site_blocks);       \
      break;                                                                                                \
  }
#define AFF_SITE_ROUTER(FNT_)                  \
  case FNT_:                                   \
    if (a.gate_bf16) {                         \
      AFF_SITE_ROUTER_COLS(FNT_, true)         \
    } else {                                   \
      AFF_SITE_ROUTER_COLS(FNT_, false)        \
    }                                          \
    break;
  switch (s.fn_dtype) {
    AFF_SITE_ROUTER(0)
    AFF_SITE_ROUTER(1)
    AFF_SITE_ROUTER(2)
    default: return internal_error("site_router: unknown mixes dtype");
  }
#undef AFF_SITE_ROUTER
#undef AFF_SITE_ROUTER_COLS
  return cuda_status(e, "site_router_sm90");
}

}  // namespace

Status site_router(const SiteRouterArgs& a, cudaStream_t stream) {
  return launch_site_router(a, true, true, Cols::kAll, stream);
}

Status site_router_split(const SiteRouterArgs& a, cudaStream_t site_stream, cudaStream_t gate_stream, bool streams_done) {
  AFF_RETURN_IF_ERROR(launch_site_router(a, false, true, streams_done ? Cols::kA : Cols::kAll, gate_stream));
  return launch_site_router(a, true, false, Cols::kAll, site_stream);
}

Status site_router_streams(const SiteRouterArgs& a, cudaStream_t stream) {
  return launch_site_router(a, false, true, Cols::kStreams, stream);
}

}  // namespace aff::cuda
