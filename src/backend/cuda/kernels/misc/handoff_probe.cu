// The hand-over probe (handoff_probe.h). 256 threads per block; a thread
// reads 16 of x's 4096 values (four 16-byte loads, or eight for the tagged
// words), the block sums them, and threads 0..31 write the block's outputs.
#include "backend/cuda/kernels/common/decode.cuh"
#include "backend/cuda/kernels/common/grid_sync.cuh"
#include "backend/cuda/kernels/common/tagged_word.cuh"
#include "backend/cuda/kernels/misc/handoff_probe.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/device_info.h"
#include "backend/cuda/runtime/pdl.h"

namespace aff::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kPer = kHandoffWidth / kThreads;       // 16 values per thread
constexpr int kOwn = kHandoffWidth / kHandoffBlocks;  // 32 outputs per block
static_assert(kPer == 16 && kOwn <= kThreads, "probe geometry");

// The block's sum of v (every thread gets it). red: [kThreads / 32] shared.
__device__ float block_total(float v, float* red) {
  v = warp_sum(v);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float s = 0.0f;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) s += red[w];
  __syncthreads();  // red is reused by the next step
  return s;
}

// This thread's 16 values of x, x[16 i .. 16 i + 16), through L2 (another
// block wrote them).
__device__ __forceinline__ void load_own(const float* x, float (&v)[kPer]) {
#pragma unroll
  for (int q = 0; q < kPer / 4; ++q) {
    const float4 f = __ldcg(reinterpret_cast<const float4*>(x + threadIdx.x * kPer) + q);
    v[4 * q] = f.x, v[4 * q + 1] = f.y, v[4 * q + 2] = f.z, v[4 * q + 3] = f.w;
  }
}

// One step's outputs from this thread's inputs v (x[16 i .. 16 i + 16)):
// y[d] = x[d] / 2 + sum(x) / 2^20 for the block's d = 32 b + j. Returns
// output first + threadIdx.x to threads below kOwn (0 to the rest).
// red: [kThreads / 32], own_x: [kOwn] shared (the block's inputs at its
// output positions).
__device__ float write_outputs(const float (&v)[kPer], float* red, float* own_x, float* y) {
  float part = 0.0f;
#pragma unroll
  for (int j = 0; j < kPer; ++j) part += v[j];
  const float sum = block_total(part, red);
  const int first = blockIdx.x * kOwn;  // inputs [first, first + 32) are held by threads first / 16, + 1
  const int i0 = int(threadIdx.x) * kPer;
  if (i0 >= first && i0 < first + kOwn) {
#pragma unroll
    for (int j = 0; j < kPer; ++j) own_x[i0 - first + j] = v[j];
  }
  __syncthreads();
  if (threadIdx.x >= kOwn) return 0.0f;
  const float out = 0.5f * own_x[threadIdx.x] + sum * (1.0f / 1048576.0f);
  y[first + threadIdx.x] = out;
  return out;
}

__global__ void __launch_bounds__(kThreads) handoff_step_kernel(const float* x, float* y) {
  pdl_start();  // a no-op without the programmatic attribute
  __shared__ float red[kThreads / 32];
  __shared__ float own_x[kOwn];
  float v[kPer];
  load_own(x, v);
  write_outputs(v, red, own_x, y);
}

__global__ void __launch_bounds__(kThreads, 1) handoff_chain_kernel(HandoffChainArgs a) {
  __shared__ float red[kThreads / 32];
  __shared__ float own_x[kOwn];
  const int first = blockIdx.x * kOwn;
  for (int i = 0; i < a.steps; ++i) {
    float v[kPer];
    if (i == 0) {
      load_own(a.x0, v);
    } else if (a.tagged != nullptr) {  // load until every word carries step i's tag
      const unsigned long long* src = a.tagged + int64_t(i - 1) * kHandoffWidth + threadIdx.x * kPer;
      const unsigned want = unsigned(i);
      bool done = false;
      while (!done) {
        done = true;
#pragma unroll
        for (int q = 0; q < kPer / 2; ++q) {
          const ulonglong2 w = ld_volatile_u64x2(src + 2 * q);
          done &= unsigned(w.x >> 32) == want && unsigned(w.y >> 32) == want;
          v[2 * q] = __uint_as_float(unsigned(w.x)), v[2 * q + 1] = __uint_as_float(unsigned(w.y));
        }
      }
    } else {
      grid_wait(a.counters + (i - 1), unsigned(gridDim.x));
      load_own(a.ys + int64_t(i - 1) * kHandoffWidth, v);
    }
    const float out = write_outputs(v, red, own_x, a.ys + int64_t(i) * kHandoffWidth);
    if (a.tagged != nullptr) {
      if (threadIdx.x < kOwn) {
        st_volatile_u64(a.tagged + int64_t(i) * kHandoffWidth + first + threadIdx.x,
                        (static_cast<unsigned long long>(i + 1) << 32) | __float_as_uint(out));
      }
    } else {
      grid_arrive(a.counters + i);
    }
    __syncthreads();  // own_x is rewritten by the next step
  }
}

}  // namespace

Status handoff_step(const float* x, float* y, bool programmatic, cudaStream_t stream) {
  if (programmatic)
    return cuda_status(launch_pdl(handoff_step_kernel, dim3(kHandoffBlocks), dim3(kThreads), 0, stream, x, y),
                       "handoff_step");
  handoff_step_kernel<<<kHandoffBlocks, kThreads, 0, stream>>>(x, y);
  return launch_status("handoff_step");
}

Status handoff_chain(const HandoffChainArgs& a, cudaStream_t stream) {
  if (a.steps <= 0) return Status::ok();
  if (current_device_multiprocessors() < kHandoffBlocks)
    return unsupported("handoff_chain: needs one SM per block");
  if (a.tagged != nullptr) {
    AFF_RETURN_IF_ERROR(cuda_status(
        cudaMemsetAsync(a.tagged, 0, size_t(a.steps) * kHandoffWidth * sizeof(unsigned long long), stream),
        "cudaMemsetAsync"));
  } else if (a.counters != nullptr) {
    AFF_RETURN_IF_ERROR(
        cuda_status(cudaMemsetAsync(a.counters, 0, size_t(a.steps) * sizeof(unsigned), stream), "cudaMemsetAsync"));
  } else {
    return internal_error("handoff_chain: no hand-over words and no counters");
  }
  handoff_chain_kernel<<<kHandoffBlocks, kThreads, 0, stream>>>(a);
  return launch_status("handoff_chain");
}

}  // namespace aff::cuda
