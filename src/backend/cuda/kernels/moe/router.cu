// router_topk_f32_sm90: one warp per token. Scores live in shared memory
// ([E] scores + [E] biased copies); k rounds of warp argmax pick the experts.
#include <cfloat>

#include "backend/cuda/kernels/common/decode.cuh"
#include "backend/cuda/kernels/mhc/mhc_coeffs.cuh"
#include "backend/cuda/kernels/moe/moe.h"
#include "backend/cuda/kernels/moe/route_select.cuh"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/pdl.h"

namespace aff::cuda {
namespace {

__global__ void router_topk_f32_sm90(RouterArgs a) {
  pdl_start();  // runtime/pdl.h: nothing in this kernel runs before the wait
  extern __shared__ float smem[];
  __shared__ int32_t sel[32];
  const int64_t t = blockIdx.x;
  route_token(a, t, a.logits + t * a.E, smem, smem + a.E, sel, a.ids + t * a.k, a.weights + t * a.k);
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
static_assert(kGateWarps <= kGateMaxT, "a block routes one token per warp");
constexpr int kGateRows = kGateWarps / kGateSplit;  // gate rows per block
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
  GateSlice<kBf16> gs(gate, D, e, e < a.E, slice);
  gs.prefetch(lane);
  // This lane's experts' biases (weights), in case this block routes (the last one).
  const LaneBias bias = lane_bias(a);
  pdl_launch_dependents();
  pdl_wait();  // x is the previous kernel's output
  const int T = int(a.T);
  float acc[kGateMaxT];
  gs.dot(x, D, T, lane, acc);
#pragma unroll
  for (int t = 0; t < kGateWarps; ++t) {
    if (t >= T) break;
    if (lane == 0) slice_sum[warp][t] = acc[t];
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
  if (warp < T)
    route_token(a, warp, lg + int64_t(warp) * a.E, smem + 2 * warp * a.E, smem + (2 * warp + 1) * a.E, sel[warp],
                a.ids + int64_t(warp) * a.k, a.weights + int64_t(warp) * a.k, &bias);
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
