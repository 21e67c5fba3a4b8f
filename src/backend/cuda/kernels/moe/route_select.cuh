// Device pieces of the decode router, shared by the router launch
// (router.cu) and the fused decode MoE (moe_decode_fast.cu), so both compute
// the same logits and picks bit for bit:
//  - GateSlice: one warp's slice of one gate row against T tokens (BF16 or F32
//    weights, f32 FMAs, 16-byte streaming loads; the first batch can be issued
//    before the launch waits for its input);
//  - route_token: one warp routes one token from its logits.
#pragma once

#include <cfloat>
#include <cstdint>

#include "backend/cuda/kernels/common/decode.cuh"
#include "backend/cuda/kernels/moe/moe.h"

namespace aff::cuda {

constexpr int kGateBatch = 8;   // 16-byte loads in flight per lane
constexpr int kGateSplit = 4;   // warps per gate row (each a quarter of its columns)
constexpr int kGateMaxT = 8;    // tokens a gate slice serves at once

__device__ __forceinline__ float route_score(ScoreFunc f, float x) {
  if (f == ScoreFunc::kSigmoid) return 1.0f / (1.0f + expf(-x));
  // sqrt(softplus(x)) with PyTorch's softplus threshold (identity above 20).
  return sqrtf(x > 20.0f ? x : log1pf(expf(x)));
}

// Slice `slice` (of kSplit) of gate row `row` ([D] values, BF16 when kBf16,
// else F32): prefetch() issues the first batch of weight loads (weights only,
// so before the wait for x), dot() finishes the slice against x [T, D] and
// leaves each token's warp-summed partial in every lane's acc[t].
template <bool kBf16, int kSplit = kGateSplit>
struct GateSlice {
  static constexpr int kPer = kBf16 ? 8 : 4;  // values per 16-byte load
  const uint8_t* row = nullptr;
  int64_t c_begin = 0, c_end = 0;
  bool ok = false;
  uint4 wv[kGateBatch];

  __device__ GateSlice(const uint8_t* gate, int64_t D, int e, bool row_ok, int slice) : ok(row_ok) {
    const int64_t n16 = D / kPer;
    c_begin = n16 * slice / kSplit, c_end = n16 * (slice + 1) / kSplit;
    row = gate + (row_ok ? int64_t(e) : 0) * D * (kBf16 ? 2 : 4);
  }

  __device__ __forceinline__ void load(int64_t base, int lane) {
#pragma unroll
    for (int j = 0; j < kGateBatch; ++j)
      if (ok && base + lane + 32 * j < c_end) wv[j] = ld_stream16(row + (base + lane + 32 * j) * 16);
  }
  __device__ __forceinline__ void prefetch(int lane) { load(c_begin, lane); }

  // The kPer weights of one 16-byte load as f32 (exact).
  __device__ __forceinline__ static void unpack(const uint4& v, float (&wf)[kPer]) {
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (kBf16) {
        wf[2 * i] = bf16_bits_to_f32(uint16_t(u[i]));
        wf[2 * i + 1] = bf16_bits_to_f32(uint16_t(u[i] >> 16));
      } else {
        wf[i] = __uint_as_float(u[i]);
      }
    }
  }

  // f(c, wf) for each of this lane's 16-byte chunks c of the slice, its
  // weights unpacked to f32 (the loads of the next batch issued first).
  template <class F>
  __device__ __forceinline__ void for_each_chunk(int lane, F&& f) {
    for (int64_t base = c_begin; base < c_end; base += 32 * kGateBatch) {
      if (base > c_begin) load(base, lane);
#pragma unroll
      for (int j = 0; j < kGateBatch; ++j) {
        const int64_t c = base + lane + 32 * j;
        if (!ok || c >= c_end) continue;
        float wf[kPer];
        unpack(wv[j], wf);
        f(c, wf);
      }
    }
  }

  // acc += w . v[0, kPer) for one chunk (v: its kPer activations).
  __device__ __forceinline__ static void fma_chunk(const float (&wf)[kPer], const float* v, float& acc) {
    const float4* xp = reinterpret_cast<const float4*>(v);
#pragma unroll
    for (int q = 0; q < kPer / 4; ++q) {
      const float4 xv = xp[q];
      acc = fmaf(wf[4 * q], xv.x, acc);
      acc = fmaf(wf[4 * q + 1], xv.y, acc);
      acc = fmaf(wf[4 * q + 2], xv.z, acc);
      acc = fmaf(wf[4 * q + 3], xv.w, acc);
    }
  }

  __device__ void dot(const float* x, int64_t D, int T, int lane, float (&acc)[kGateMaxT]) {
#pragma unroll
    for (int t = 0; t < kGateMaxT; ++t) acc[t] = 0.0f;
    for_each_chunk(lane, [&](int64_t c, const float (&wf)[kPer]) {
#pragma unroll
      for (int t = 0; t < kGateMaxT; ++t) {
        if (t >= T) break;
        fma_chunk(wf, x + int64_t(t) * D + c * kPer, acc[t]);
      }
    });
#pragma unroll
    for (int t = 0; t < kGateMaxT; ++t) {
      if (t >= T) break;
      acc[t] = warp_sum(acc[t]);
    }
  }

  // The slice against the five vectors the second mHC site's x is made of
  // (moe/site_router.h), for each of T <= kMaxT tokens: column 5t is the
  // sublayer output a[t], column 5t + 1 + j the previous site's stream j,
  // each scaled by the ffn norm's weight g first. Every lane ends with the
  // warp's sums in acc.
  //   a: [T, D]; hs: [T, 4, D]; g: [D]; acc: [5 * kMaxT].
  // Columns [kC0, kC0 + kNC) of them only (kC0 = 1, kNC = 4: the streams;
  // kC0 = 0, kNC = 1: a), the others left zero; a or hs may then be null.
  template <int kMaxT, int kC0 = 0, int kNC = 5>
  __device__ void dot_streams(const float* a, const float* hs, const float* g, int64_t D, int T, int lane,
                              float (&acc)[5 * kMaxT]) {
    static_assert(kC0 >= 0 && kNC >= 1 && kC0 + kNC <= 5, "columns within a and the four streams");
#pragma unroll
    for (int i = 0; i < 5 * kMaxT; ++i) acc[i] = 0.0f;
    for_each_chunk(lane, [&](int64_t c, const float (&w)[kPer]) {
      // w * g once per column, then five FMAs per column and token.
      float wf[kPer];
      const float4* gp = reinterpret_cast<const float4*>(g + c * kPer);
#pragma unroll
      for (int q = 0; q < kPer / 4; ++q) {
        const float4 gv = gp[q];
        wf[4 * q] = w[4 * q] * gv.x, wf[4 * q + 1] = w[4 * q + 1] * gv.y;
        wf[4 * q + 2] = w[4 * q + 2] * gv.z, wf[4 * q + 3] = w[4 * q + 3] * gv.w;
      }
#pragma unroll
      for (int t = 0; t < kMaxT; ++t) {
        if (t >= T) break;
        if constexpr (kC0 == 0) fma_chunk(wf, a + int64_t(t) * D + c * kPer, acc[5 * t]);
#pragma unroll
        for (int v = 0; v < 4; ++v)
          if (1 + v >= kC0 && 1 + v < kC0 + kNC)
            fma_chunk(wf, hs + (int64_t(t) * 4 + v) * D + c * kPer, acc[5 * t + 1 + v]);
      }
    });
#pragma unroll
    for (int i = 0; i < 5 * kMaxT; ++i) {
      if (i >= 5 * T) break;
      if (i % 5 >= kC0 && i % 5 < kC0 + kNC) acc[i] = warp_sum(acc[i]);
    }
  }
};

// (v, id) ranks above (w, jd): a larger value, ties to the lower id.
__device__ __forceinline__ bool ranks_above(float v, int id, float w, int jd) { return v > w || (v == w && id < jd); }

// Experts a lane holds in the register top-k (E <= 32 * kTopkPerLane).
constexpr int kTopkPerLane = 8;

// The k best of a warp's E <= 256 candidates, lane l holding experts l, l + 32,
// ...: each lane sorts its 8 (a fixed network, no dependence between the
// lanes), then each round the warp takes the best of the lanes' heads and the
// winning lane drops its head. The same picks in the same order as k rounds
// of a full argmax, with one butterfly per pick and nothing through shared
// memory. sel: [k] shared, written by lane 0.
__device__ __forceinline__ void topk_registers(float (&v)[kTopkPerLane], int (&id)[kTopkPerLane], int k, int32_t* sel) {
  const int lane = threadIdx.x & 31;
  auto cas = [&](int i, int j) {  // after unrolling, i and j are constants: registers stay registers
    if (ranks_above(v[j], id[j], v[i], id[i])) {
      const float tv = v[i];
      const int ti = id[i];
      v[i] = v[j], id[i] = id[j], v[j] = tv, id[j] = ti;
    }
  };
  // Batcher's odd-even merge sort of 8 (19 compare-exchanges).
  cas(0, 1), cas(2, 3), cas(4, 5), cas(6, 7);
  cas(0, 2), cas(1, 3), cas(4, 6), cas(5, 7);
  cas(1, 2), cas(5, 6);
  cas(0, 4), cas(1, 5), cas(2, 6), cas(3, 7);
  cas(2, 4), cas(3, 5);
  cas(1, 2), cas(3, 4), cas(5, 6);
  for (int i = 0; i < k; ++i) {
    float bv = v[0];
    int bi = id[0];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ranks_above(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    if (id[0] == bi) {  // this lane's head was taken
#pragma unroll
      for (int j = 0; j + 1 < kTopkPerLane; ++j) v[j] = v[j + 1], id[j] = id[j + 1];
      v[kTopkPerLane - 1] = -INFINITY, id[kTopkPerLane - 1] = 0x7fffffff;
    }
    if (lane == 0) sel[i] = bi;
  }
}

// This lane's correction biases for the register top-k (experts lane, lane +
// 32, ...), loaded ahead: they are weights, so a launch can read them before
// its wait, off the picks' chain. ok: false where the kernel had none to load
// (route_token then reads a.bias itself).
struct LaneBias {
  float v[kTopkPerLane];
  bool ok;
};

__device__ __forceinline__ LaneBias lane_bias(const RouterArgs& a) {
  LaneBias b;
  b.ok = a.bias != nullptr && a.tid2eid == nullptr && a.E <= 32 * kTopkPerLane;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int j = 0; j < kTopkPerLane; ++j) {
    const int e = lane + 32 * j;
    b.v[j] = b.ok && e < a.E ? a.bias[e] : 0.0f;
  }
  return b;
}

// One warp routes token t from its logits lg: [E] (global or shared memory):
// scores, k picks of score + bias (ties: lower id) or the hash table's, and
// the normalised weights into ids [k] / weights [k] (global or shared). s,
// biased: [E] shared scratch of this warp (biased only for E > 256); sel:
// [32] shared.
__device__ inline void route_token(const RouterArgs& a, int64_t t, const float* lg, float* s, float* biased,
                                   int32_t* sel, int32_t* ids, float* weights, const LaneBias* pre = nullptr) {
  const int lane = threadIdx.x & 31;
  if (a.func == ScoreFunc::kSoftmax) {
    float m = -FLT_MAX;
    for (int e = lane; e < a.E; e += 32) m = fmaxf(m, lg[e]);
    m = warp_max(m);
    float sum = 0.0f;
    for (int e = lane; e < a.E; e += 32) {
      s[e] = expf(lg[e] - m);
      sum += s[e];
    }
    sum = warp_sum(sum);
    const float inv = 1.0f / sum;
    for (int e = lane; e < a.E; e += 32) s[e] *= inv;
  } else {
    for (int e = lane; e < a.E; e += 32) s[e] = route_score(a.func, lg[e]);
  }
  __syncwarp();
  // The picks stay in shared memory: reading them back from the global output
  // costs an L2 round trip per expert.
  if (a.tid2eid) {
    if (lane < a.k) sel[lane] = a.tid2eid[int64_t(a.tokens[t]) * a.k + lane];
  } else if (a.E <= 32 * kTopkPerLane) {
    float v[kTopkPerLane];
    int id[kTopkPerLane];
#pragma unroll
    for (int j = 0; j < kTopkPerLane; ++j) {
      const int e = lane + 32 * j;
      id[j] = e < a.E ? e : 0x7fffffff;
      const float bias = pre != nullptr && pre->ok ? pre->v[j] : a.bias ? a.bias[e] : 0.0f;
      v[j] = e < a.E ? s[e] + bias : -INFINITY;
    }
    topk_registers(v, id, a.k, sel);
  } else {
    for (int e = lane; e < a.E; e += 32) biased[e] = s[e] + (a.bias ? a.bias[e] : 0.0f);
    __syncwarp();
    for (int i = 0; i < a.k; ++i) {
      float best = -INFINITY;
      int best_id = 0x7fffffff;
      for (int e = lane; e < a.E; e += 32) {
        const float v = biased[e];
        if (ranks_above(v, e, best, best_id)) best = v, best_id = e;
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, best, o);
        const int oid = __shfl_xor_sync(0xffffffffu, best_id, o);
        if (ranks_above(ov, oid, best, best_id)) best = ov, best_id = oid;
      }
      if (lane == 0) {
        sel[i] = best_id;
        biased[best_id] = -INFINITY;
      }
      __syncwarp();
    }
  }
  __syncwarp();
  // Sum in pick order (as the reference), every lane the same; lane i writes pick i.
  float sum = 0.0f;
  for (int i = 0; i < a.k; ++i) sum += s[sel[i]];
  if (lane < a.k) {
    ids[lane] = sel[lane];
    weights[lane] = s[sel[lane]] / (sum + 1e-20f) * a.scaling;
  }
}

}  // namespace aff::cuda
