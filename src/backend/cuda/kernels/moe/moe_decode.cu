// Decode MoE in two launches (moe.h): all routed pairs and the shared expert of
// every token share one up launch and one down launch. The V4 layouts (ggml
// routed experts in Q2_K / Q3_K / IQ2_XXS, FP8 shared expert) take the
// streaming kernels of moe_decode_fast.cu; everything else the general ones here.
//
// moe_up_any_f32_sm90: work items are (pair, group of R rows of the
// intermediate); a block's warps split each row S ways, every warp-group
// computes both the gate (w1) and up (w3) dot and writes the clamped SwiGLU.
// moe_down_any_f32_sm90: a warp owns one output row d; for each token it walks
// the token's pairs in order (routed j = 0..k-1, then shared), so the combine
// is a fixed-order sum in registers and the result is deterministic.
// ggml-format experts read int8 activations staged in shared memory once per
// block (x for up, every pair's act for down); blocks stride over work items,
// two per SM, so staging is paid a few hundred times per launch, not per row.
#include <algorithm>

#include "backend/cuda/kernels/common/fast_dot.cuh"
#include "backend/cuda/kernels/moe/moe.h"
#include "backend/cuda/kernels/moe/moe_decode_fast.h"
#include "backend/cuda/kernels/moe/swiglu.cuh"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/device_info.h"
#include "backend/cuda/runtime/smem_limit.h"

namespace aff::cuda {
namespace {

constexpr int kWarps = 16;
constexpr int64_t kMaxStageBytes = 200 * 1024;

struct UpArgs {
  MoeDecodeArgs m;
  int split;        // S warps per row
  bool stage;       // some expert is in a ggml format: stage x as int8
  int64_t ring_at;  // byte offset of the per-warp ggml rings in dynamic smem (< 0: none)
};

// The slot and token of pair p (routed pairs first, then one shared pair per token).
__device__ __forceinline__ const ExpertSlot& pair_slot(const MoeDecodeArgs& m, int64_t p, int64_t& t) {
  const int64_t routed = m.T * m.k;
  if (p < routed) {
    t = p / m.k;
    return m.slots[m.ids[p]];
  }
  t = p - routed;
  return m.shared_slot[0];
}

template <WPath PR, WPath PS>
__global__ void __launch_bounds__(kWarps * 32) moe_up_any_f32_sm90(UpArgs a) {
  extern __shared__ __align__(16) uint8_t xs_smem[];
  __shared__ float red[kWarps][2];
  const MoeDecodeArgs& m = a.m;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int S = a.split, R = kWarps / S, part = warp % S, sub = warp / S;
  if (a.stage) {
    act_q8_stage(m.x, m.D, int(m.T), m.D, xs_smem);
    __syncthreads();
  }
  const int64_t n_pairs = m.T * m.k + (m.shared_slot ? m.T : 0);
  const int64_t groups = (m.inter + R - 1) / R;
  const int64_t stride = act_q8_stride(m.D);
  for (int64_t item = blockIdx.x; item < n_pairs * groups; item += gridDim.x) {
    const int64_t p = item / groups, r = (item % groups) * R + sub;
    int64_t t = 0;
    const ExpertSlot& slot = pair_slot(m, p, t);
    float g[1] = {0.0f}, u[1] = {0.0f};
    if (r < m.inter) {
      const ActF32 x{m.x + t * m.D, m.D, (reinterpret_cast<uintptr_t>(m.x) % 16 == 0) && (m.D % 4 == 0)};
      const uint8_t* xs = xs_smem + t * stride;
      uint8_t* ring = a.ring_at >= 0 ? xs_smem + a.ring_at + warp * kGgmlRingBytes : nullptr;
      if (p < m.T * m.k) {
        row_part_p<PR, 1>(slot.w1, r, x, xs, 1, part, S, ring, g);
        row_part_p<PR, 1>(slot.w3, r, x, xs, 1, part, S, ring, u);
      } else {
        row_part_p<PS, 1>(slot.w1, r, x, xs, 1, part, S, ring, g);
        row_part_p<PS, 1>(slot.w3, r, x, xs, 1, part, S, ring, u);
      }
    }
    g[0] = warp_sum(g[0]);
    u[0] = warp_sum(u[0]);
    if (S > 1) {
      if (lane == 0) red[warp][0] = g[0], red[warp][1] = u[0];
      __syncthreads();
      if (part == 0 && lane == 0) {
        float gs = 0.0f, us = 0.0f;
        for (int q = 0; q < S; ++q) gs += red[sub * S + q][0], us += red[sub * S + q][1];
        g[0] = gs, u[0] = us;
      }
      __syncthreads();
    }
    if (part == 0 && lane == 0 && r < m.inter) m.act[p * m.inter + r] = swiglu_clamp(g[0], u[0], m.swiglu_limit);
  }
}

struct DownArgs {
  MoeDecodeArgs m;
  bool stage;       // some expert is in a ggml format: stage every pair's act as int8
  int64_t ring_at;  // byte offset of the per-warp ggml rings in dynamic smem (< 0: none)
};

template <WPath PR, WPath PS>
__global__ void __launch_bounds__(kWarps * 32) moe_down_any_f32_sm90(DownArgs a) {
  extern __shared__ __align__(16) uint8_t xs_smem[];
  const MoeDecodeArgs& m = a.m;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t n_pairs = m.T * m.k + (m.shared_slot ? m.T : 0);
  if (a.stage) {
    act_q8_stage(m.act, m.inter, int(n_pairs), m.inter, xs_smem);
    __syncthreads();
  }
  const int64_t stride = act_q8_stride(m.inter);
  const bool vec = (reinterpret_cast<uintptr_t>(m.act) % 16 == 0) && (m.inter % 4 == 0);
  for (int64_t d0 = int64_t(blockIdx.x) * kWarps; d0 < m.D; d0 += int64_t(gridDim.x) * kWarps) {
    const int64_t d = d0 + warp;
    if (d >= m.D) continue;  // no block-wide barrier below: warps may leave early
    for (int64_t t = 0; t < m.T; ++t) {
      float total = 0.0f;
      for (int j = 0; j <= m.k; ++j) {
        int64_t p;
        const ExpertSlot* slot;
        float wgt = 1.0f;
        if (j < m.k) {
          p = t * m.k + j;
          slot = &m.slots[m.ids[p]];
          wgt = m.route_w[p];
        } else {
          if (!m.shared_slot) break;
          p = m.T * m.k + t;
          slot = m.shared_slot;
        }
        float acc[1] = {0.0f};
        const ActF32 x{m.act + p * m.inter, m.inter, vec};
        uint8_t* ring = a.ring_at >= 0 ? xs_smem + a.ring_at + warp * kGgmlRingBytes : nullptr;
        if (j < m.k) row_part_p<PR, 1>(slot->w2, d, x, xs_smem + p * stride, 1, 0, 1, ring, acc);
        else row_part_p<PS, 1>(slot->w2, d, x, xs_smem + p * stride, 1, 0, 1, ring, acc);
        total = fmaf(wgt, warp_sum(acc[0]), total);
      }
      if (lane == 0) m.out[t * m.D + d] = total;
    }
  }
}


bool g_ggml_ring = true;
bool g_fast = true;

// Raises a kernel's dynamic shared memory limit the first time it is launched
// (the first decode step runs eagerly, before any graph capture).
Status allow_smem(const void* kernel) { return raise_smem_limit(kernel, int(kMaxStageBytes)); }

using UpKernel = void (*)(UpArgs);
using DownKernel = void (*)(DownArgs);

// Compiled decoder pairs (routed, shared): every routed path with an FP8 shared
// expert (V4's layout), BF16 with BF16; anything else takes the runtime switch.
template <template <WPath, WPath> class K>
auto select_pair(WPath pr, WPath ps) -> decltype(&K<WPath::kAny, WPath::kAny>::run) {
#define AFF_MOE_PAIR(R_) \
  case WPath::R_: return &K<WPath::R_, WPath::kFP8>::run;
  if (ps == WPath::kFP8) {
    switch (pr) {
      AFF_MOE_PAIR(kFP8)
      AFF_MOE_PAIR(kMXFP4)
      AFF_MOE_PAIR(kBF16)
      AFF_MOE_PAIR(kQ8_0)
      AFF_MOE_PAIR(kQ2_K)
      AFF_MOE_PAIR(kQ3_K)
      AFF_MOE_PAIR(kQ4_K)
      AFF_MOE_PAIR(kIQ2_XXS)
      AFF_MOE_PAIR(kIQ4_XS)
      AFF_MOE_PAIR(kMXFP4g)
      default: break;
    }
  }
#undef AFF_MOE_PAIR
  if (pr == WPath::kBF16 && ps == WPath::kBF16) return &K<WPath::kBF16, WPath::kBF16>::run;
  return &K<WPath::kAny, WPath::kAny>::run;
}

template <WPath PR, WPath PS>
struct UpK {
  static constexpr UpKernel run = moe_up_any_f32_sm90<PR, PS>;
};
template <WPath PR, WPath PS>
struct DownK {
  static constexpr DownKernel run = moe_down_any_f32_sm90<PR, PS>;
};

// Paths of the routed and shared weights of one projection; a side with no
// work takes the other's path (its code is never reached).
void paths(const MoeDecodeArgs& m, bool up, WPath& pr, WPath& ps) {
  pr = wpath_of(m.routed_format, up ? m.routed_ggml_up : m.routed_ggml_down);
  ps = wpath_of(m.shared_format, up ? m.shared_ggml_up : m.shared_ggml_down);
  if (!m.shared_slot) ps = WPath::kFP8;
  if (m.k == 0) pr = ps;
}

bool any_ggml(const MoeDecodeArgs& m) {
  return (m.k > 0 && m.routed_format == DevFormat::kGgml) || (m.shared_slot && m.shared_format == DevFormat::kGgml);
}

Status check(const MoeDecodeArgs& m) {
  if (m.T < 1 || m.T > kMoeDecodeMaxTokens) return internal_error("moe_decode: T outside [1, 8]");
  if (m.k > 0 && (!m.slots || !m.ids || !m.route_w)) return internal_error("moe_decode: routed pairs without a table");
  if (m.D % 32 != 0 || m.inter % 32 != 0) return internal_error("moe_decode: D and inter must be multiples of 32");
  return Status::ok();
}

}  // namespace

Status moe_decode_prepare() {
  const WPath routed[] = {WPath::kFP8, WPath::kMXFP4, WPath::kBF16, WPath::kQ8_0, WPath::kQ2_K,
                          WPath::kQ3_K, WPath::kQ4_K, WPath::kIQ2_XXS, WPath::kIQ4_XS, WPath::kMXFP4g};
  for (WPath pr : routed) {
    AFF_RETURN_IF_ERROR(allow_smem(reinterpret_cast<const void*>(*select_pair<UpK>(pr, WPath::kFP8))));
    AFF_RETURN_IF_ERROR(allow_smem(reinterpret_cast<const void*>(*select_pair<DownK>(pr, WPath::kFP8))));
  }
  AFF_RETURN_IF_ERROR(allow_smem(reinterpret_cast<const void*>(*select_pair<UpK>(WPath::kBF16, WPath::kBF16))));
  AFF_RETURN_IF_ERROR(allow_smem(reinterpret_cast<const void*>(*select_pair<DownK>(WPath::kBF16, WPath::kBF16))));
  AFF_RETURN_IF_ERROR(allow_smem(reinterpret_cast<const void*>(*select_pair<UpK>(WPath::kAny, WPath::kAny))));
  AFF_RETURN_IF_ERROR(allow_smem(reinterpret_cast<const void*>(*select_pair<DownK>(WPath::kAny, WPath::kAny))));
  return moe_fast_prepare();
}

void moe_decode_set_ggml_ring(bool on) { g_ggml_ring = on; }
void moe_decode_set_fast(bool on) { g_fast = on; }
bool moe_decode_streams(const MoeDecodeArgs& m) { return g_fast && moe_fast_supported(m); }

Status moe_decode_up(const MoeDecodeArgs& m, cudaStream_t stream) {
  AFF_RETURN_IF_ERROR(check(m));
  if (moe_decode_streams(m)) return moe_fast_up(m, stream);
  if (m.add != nullptr || m.max_sms != 0) return internal_error("moe_decode_up: add / max_sms need the streaming kernels");
  const int64_t n_pairs = m.T * m.k + (m.shared_slot ? m.T : 0);
  if (n_pairs == 0) return Status::ok();
  const bool stage = any_ggml(m);
  const int64_t staged = stage ? act_q8_bytes(m.T, m.D) : 0;
  if (staged > kMaxStageBytes) return internal_error("moe_decode_up: activations too large to stage");
  const bool ring = stage && g_ggml_ring && staged + kWarps * kGgmlRingBytes <= kMaxStageBytes;
  const size_t smem = size_t(staged + (ring ? kWarps * kGgmlRingBytes : 0));
  WPath pr, ps;
  paths(m, true, pr, ps);
  const UpKernel kernel = *select_pair<UpK>(pr, ps);
  if (smem > 48 * 1024) AFF_RETURN_IF_ERROR(allow_smem(reinterpret_cast<const void*>(kernel)));
  const int sms = current_device_multiprocessors();
  // Split each row across warps while there are fewer than ~2 waves of warp rows.
  int S = 1;
  while (S < kWarps && n_pairs * m.inter * S < int64_t(sms) * 64 * 2 && m.D >= int64_t(32 * 32) * S * 2) S *= 2;
  const int64_t items = n_pairs * ((m.inter + (kWarps / S) - 1) / (kWarps / S));
  const int64_t blocks = std::min<int64_t>(items, stage ? int64_t(sms) * 2 : int64_t(sms) * 4);
  kernel<<<unsigned(blocks), kWarps * 32, smem, stream>>>(UpArgs{m, S, stage, ring ? staged : -1});
  return launch_status("moe_up_any_f32_sm90");
}

Status moe_decode_down(const MoeDecodeArgs& m, cudaStream_t stream) {
  AFF_RETURN_IF_ERROR(check(m));
  if (moe_decode_streams(m)) return moe_fast_down(m, stream);
  if (m.add != nullptr || m.max_sms != 0) return internal_error("moe_decode_down: add / max_sms need the streaming kernels");
  const int64_t n_pairs = m.T * m.k + (m.shared_slot ? m.T : 0);
  const bool stage = any_ggml(m);
  const int64_t staged = stage ? act_q8_bytes(n_pairs, m.inter) : 0;
  if (staged > kMaxStageBytes) return internal_error("moe_decode_down: activations too large to stage");
  const bool ring = stage && g_ggml_ring && staged + kWarps * kGgmlRingBytes <= kMaxStageBytes;
  const size_t smem = size_t(staged + (ring ? kWarps * kGgmlRingBytes : 0));
  WPath pr, ps;
  paths(m, false, pr, ps);
  const DownKernel kernel = *select_pair<DownK>(pr, ps);
  if (smem > 48 * 1024) AFF_RETURN_IF_ERROR(allow_smem(reinterpret_cast<const void*>(kernel)));
  const int sms = current_device_multiprocessors();
  const int64_t groups = (m.D + kWarps - 1) / kWarps;
  const int64_t blocks = std::min<int64_t>(groups, stage ? int64_t(sms) * 2 : int64_t(sms) * 4);
  kernel<<<unsigned(blocks), kWarps * 32, smem, stream>>>(DownArgs{m, stage, ring ? staged : -1});
  return launch_status("moe_down_any_f32_sm90");
}

}  // namespace aff::cuda
