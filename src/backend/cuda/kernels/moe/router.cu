// router_topk_f32_sm90: one warp per token. Scores live in shared memory
// ([E] scores + [E] biased copies); k rounds of warp argmax pick the experts.
#include <cfloat>

#include "backend/cuda/kernels/common/decode.cuh"
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

__global__ void router_topk_f32_sm90(RouterArgs a) {
  pdl_start();  // runtime/pdl.h: nothing in this kernel runs before the wait
  extern __shared__ float smem[];
  float* s = smem;          // [E] scores
  float* biased = smem + a.E;  // [E] selection keys
  const int lane = threadIdx.x;
  const int64_t t = blockIdx.x;
  const float* lg = a.logits + t * a.E;

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
  __shared__ int32_t sel[32];
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

}  // namespace

Status router_topk(const RouterArgs& a, cudaStream_t stream) {
  if (a.T == 0) return Status::ok();
  if (a.k > 32 || a.k > a.E) return internal_error("router_topk: k must be <= 32 and <= E");
  const size_t smem = size_t(a.E) * 2 * sizeof(float);
  if (smem > 48 * 1024) return internal_error("router_topk: too many experts for shared memory");
  const cudaError_t e = launch_pdl(router_topk_f32_sm90, dim3(unsigned(a.T)), dim3(32), smem, stream, a);
  return cuda_status(e, "router_topk_f32_sm90");
}

}  // namespace aff::cuda
