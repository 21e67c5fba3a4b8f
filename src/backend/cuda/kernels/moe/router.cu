// router_topk_f32_sm90: one warp per token. Scores live in shared memory
// ([E] scores + [E] biased copies); k rounds of warp argmax pick the experts.
#include <cfloat>

#include "backend/cuda/kernels/common/decode.cuh"
#include "backend/cuda/kernels/mhc/mhc_coeffs.cuh"
#include "backend/cuda/kernels/moe/moe.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/pdl.h"

namespace aff::cuda {
namespace {

__device__ __forceinline__ float score_of(ScoreFunc f, float x) {
  if (f == ScoreFunc::kSigmoid) return 1.0f / (1.0f + expf(-x));
  // sqrt(softplus(x)) with PyTorch's softplus threshold (identity above 20).
  return sqrtf(x > 20.0f ? x : log1pf(expf(x)));
}

// One warp routes token t from its logits lg: [E] (global or shared memory):
// scores, k picks of score + bias (ties: lower id) or the hash table's, and
// the normalised weights into a.ids / a.weights. s, biased: [E] shared
// scratch of this warp; sel: [32] shared.
__device__ void route_token(const RouterArgs& a, int64_t t, const float* lg, float* s, float* biased, int32_t* sel) {
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
    for (int e = lane; e < a.E; e += 32) s[e] = score_of(a.func, lg[e]);
  }
  __syncwarp();

  // The picks stay in shared memory: reading them back from the global output
  // costs an L2 round trip per expert.
  if (a.tid2eid) {
    if (lane < a.k) sel[lane] = a.tid2eid[int64_t(a.tokens[t]) * a.k + lane];
  } else {
    for (int e = lane; e < a.E; e += 32) biased[e] = s[e] + (a.bias ? a.bias[e] : 0.0f);
    __syncwarp();
    for (int i = 0; i < a.k; ++i) {
      float best = -INFINITY;
      int best_id = 0x7fffffff;
      for (int e = lane; e < a.E; e += 32) {
        const float v = biased[e];
        if (v > best || (v == best && e < best_id)) best = v, best_id = e;
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, best, o);
        const int oid = __shfl_xor_sync(0xffffffffu, best_id, o);
        if (ov > best || (ov == best && oid < best_id)) best = ov, best_id = oid;
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
    a.ids[t * a.k + lane] = sel[lane];
    a.weights[t * a.k + lane] = s[sel[lane]] / (sum + 1e-20f) * a.scaling;
  }
}

__global__ void router_topk_f32_sm90(RouterArgs a) {
  pdl_start();  // runtime/pdl.h: nothing in this kernel runs before the wait
  extern __shared__ float smem[];
  __shared__ int32_t sel[32];
  route_token(a, blockIdx.x, a.logits + int64_t(blockIdx.x) * a.E, smem, smem + a.E, sel);
}

// Decode router in one launch: kGateSplit warps share gate row e, each a
// slice of its columns, against every token (f32 FMAs on the stored BF16 or
// F32 values, 16-byte streaming loads, the first batch issued before the
// wait); the slices are added in order, the logits written, and the last
// block to finish (a ticket, reset for the next launch) routes the tokens,
// warp t taking token t. One launch instead of a GEMV and a top-k. Why split
// rows: a warp per row put V4's 2 MB gate on 32 SMs, whose own load
// bandwidth then set the time; split four ways it spreads over 128.
constexpr int kGateWarps = 8;
constexpr int kGateSplit = 4;                       // warps per gate row
constexpr int kGateRows = kGateWarps / kGateSplit;  // gate rows per block
constexpr int kGateBatch = 8;  // 16-byte loads in flight per lane
template <bool kBf16>
__global__ void __launch_bounds__(kGateWarps * 32) router_gate_topk_sm90(RouterArgs a, const uint8_t* gate, int64_t D,
                                                                         const float* x, unsigned* ticket,
                                                                         HcCombJob job) {
  extern __shared__ float smem[];  // per warp: [E] scores, [E] keys; then [T, E] logits
  __shared__ int32_t sel[kGateWarps][32];
  __shared__ float slice_sum[kGateWarps][kGateWarps];  // [warp][token]
  __shared__ bool last;
  // A deferred mHC comb (mhc.h) in one extra block, the last, beside the gate.
  const unsigned gate_blocks = gridDim.x - (job.comb != nullptr ? 1u : 0u);
  if (blockIdx.x == gate_blocks) {
    pdl_start();  // the comb logits are the previous kernel's output
    hc_comb_job_run(job);
    return;
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int e = int(blockIdx.x) * kGateRows + warp / kGateSplit, slice = warp % kGateSplit;
  const bool row_ok = e < a.E;
  constexpr int kPer = kBf16 ? 8 : 4;  // values per 16-byte load
  const int64_t n16 = D / kPer;
  const int64_t c_begin = n16 * slice / kGateSplit, c_end = n16 * (slice + 1) / kGateSplit;
  const uint8_t* row = gate + (row_ok ? int64_t(e) : 0) * D * (kBf16 ? 2 : 4);
  uint4 wv[kGateBatch];
#pragma unroll
  for (int j = 0; j < kGateBatch; ++j)
    if (row_ok && c_begin + lane + 32 * j < c_end) wv[j] = ld_stream16(row + (c_begin + lane + 32 * j) * 16);
  pdl_launch_dependents();
  pdl_wait();  // x is the previous kernel's output

  const int T = int(a.T);
  float acc[kGateWarps] = {};
  for (int64_t base = c_begin; base < c_end; base += 32 * kGateBatch) {
    if (base > c_begin) {
#pragma unroll
      for (int j = 0; j < kGateBatch; ++j)
        if (row_ok && base + lane + 32 * j < c_end) wv[j] = ld_stream16(row + (base + lane + 32 * j) * 16);
    }
#pragma unroll
    for (int j = 0; j < kGateBatch; ++j) {
      const int64_t c = base + lane + 32 * j;
      if (!row_ok || c >= c_end) continue;
      float wf[kPer];
      const uint32_t u[4] = {wv[j].x, wv[j].y, wv[j].z, wv[j].w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if constexpr (kBf16) {
          wf[2 * i] = bf16_bits_to_f32(uint16_t(u[i]));
          wf[2 * i + 1] = bf16_bits_to_f32(uint16_t(u[i] >> 16));
        } else {
          wf[i] = __uint_as_float(u[i]);
        }
      }
#pragma unroll
      for (int t = 0; t < kGateWarps; ++t) {
        if (t >= T) break;
        const float4* xp = reinterpret_cast<const float4*>(x + int64_t(t) * D + c * kPer);
#pragma unroll
        for (int q = 0; q < kPer / 4; ++q) {
          const float4 xv = xp[q];
          acc[t] = fmaf(wf[4 * q], xv.x, acc[t]);
          acc[t] = fmaf(wf[4 * q + 1], xv.y, acc[t]);
          acc[t] = fmaf(wf[4 * q + 2], xv.z, acc[t]);
          acc[t] = fmaf(wf[4 * q + 3], xv.w, acc[t]);
        }
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kGateWarps; ++t) {
    if (t >= T) break;
    const float v = warp_sum(acc[t]);
    if (lane == 0) slice_sum[warp][t] = v;
  }
  __syncthreads();
  // A row's slices added in slice order (deterministic), a thread per (row, token).
  if (threadIdx.x < kGateRows * T) {
    const int r = threadIdx.x / T, t = threadIdx.x % T, er = int(blockIdx.x) * kGateRows + r;
    float v = 0.0f;
#pragma unroll
    for (int q = 0; q < kGateSplit; ++q) v += slice_sum[r * kGateSplit + q][t];
    if (er < a.E) a.logits[int64_t(t) * a.E + er] = v;
  }

  // The last block routes: every block's logits are visible to it after the
  // fence before its ticket and the fence after (the usual last-block pattern).
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(ticket, 1u) == gate_blocks - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  float* lg = smem + 2 * kGateWarps * a.E;
  for (int i = threadIdx.x; i < T * a.E; i += blockDim.x) lg[i] = __ldcg(a.logits + i);
  if (threadIdx.x == 0) *ticket = 0u;
  __syncthreads();
  if (warp < T) route_token(a, warp, lg + int64_t(warp) * a.E, smem + 2 * warp * a.E, smem + (2 * warp + 1) * a.E, sel[warp]);
}

}  // namespace

Status router_topk(const RouterArgs& a, cudaStream_t stream) {
  if (a.T == 0) return Status::ok();
  if (a.k > 32 || a.k > a.E) return internal_error("router_topk: k must be <= 32 and <= E");
  const size_t smem = size_t(a.E) * 2 * sizeof(float);
  if (smem > 48 * 1024) return internal_error("router_topk: too many experts for shared memory");
  const cudaError_t e = launch_pdl(router_topk_f32_sm90, dim3(unsigned(a.T)), dim3(32), smem, stream, a);
  return cuda_status(e, "router_topk_f32_sm90");
}

namespace {
size_t gate_topk_smem(const RouterArgs& a) { return size_t(2 * kGateWarps + a.T) * size_t(a.E) * sizeof(float); }
}  // namespace

bool router_gate_topk_supports(const RouterArgs& a, const DeviceLinear& gate) {
  const bool bf16 = gate.format == DevFormat::kBF16, f32 = gate.format == DevFormat::kF32;
  return (bf16 || f32) && a.T >= 1 && a.T <= kGateWarps && a.k >= 1 && a.k <= 32 && a.k <= a.E &&
         gate.out == a.E && gate.in % ((bf16 ? 8 : 4) * 32) == 0 && reinterpret_cast<uintptr_t>(gate.weight) % 16 == 0 &&
         gate_topk_smem(a) <= 48 * 1024;
}

Status router_gate_topk(const RouterArgs& a, const DeviceLinear& gate, const float* x, unsigned* ticket,
                        cudaStream_t stream, const HcCombJob& job) {
  if (!router_gate_topk_supports(a, gate)) return internal_error("router_gate_topk: unsupported shape or format");
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0) return internal_error("router_gate_topk: x must be 16-byte aligned");
  const dim3 grid(unsigned((a.E + kGateRows - 1) / kGateRows + (job.comb != nullptr ? 1 : 0))), block(kGateWarps * 32);
  const auto kernel = gate.format == DevFormat::kBF16 ? router_gate_topk_sm90<true> : router_gate_topk_sm90<false>;
  const cudaError_t e =
      launch_pdl(kernel, grid, block, gate_topk_smem(a), stream, a, gate.weight, gate.in, x, ticket, job);
  return cuda_status(e, "router_gate_topk_sm90");
}

}  // namespace aff::cuda
