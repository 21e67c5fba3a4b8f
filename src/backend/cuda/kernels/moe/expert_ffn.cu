// Expert FFN kernels batched over routed (token, expert) pairs:
//   moe_up_<fmt>_f32_sm90:   act[p] = swiglu_clamp(w1 x, w3 x), one warp per row;
//   moe_down_<fmt>_f32_sm90: y[p] = w2 act[p];
//   moe_combine_f32_sm90:    weighted sum over a token's pairs (+ shared expert).
// Each pair reads its expert through the slot table, so an expert's bytes may
// live anywhere the device can address.
#include "backend/cuda/kernels/common/row_dot.cuh"
#include "backend/cuda/kernels/moe/moe.h"
#include "backend/cuda/kernels/moe/swiglu.cuh"
#include "backend/cuda/runtime/cuda_check.h"

namespace aff::cuda {
namespace {

constexpr int kRowsPerBlock = 8;

template <DevFormat F>
__device__ __forceinline__ void moe_up_body(const ExpertFfnArgs& a) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t r = int64_t(blockIdx.x) * kRowsPerBlock + warp;
  const int64_t p = blockIdx.y;
  if (r >= a.inter) return;
  const ExpertSlot& slot = a.slots[a.ids[p]];
  const float* x = a.x + (p / a.pairs_per_token) * a.D;
  const float g = row_dot1<F>(slot.w1, r, x);
  const float u = row_dot1<F>(slot.w3, r, x);
  if (lane == 0) a.act[p * a.inter + r] = swiglu_clamp(g, u, a.swiglu_limit);
}

template <DevFormat F>
__device__ __forceinline__ void moe_down_body(const ExpertFfnArgs& a) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t r = int64_t(blockIdx.x) * kRowsPerBlock + warp;
  const int64_t p = blockIdx.y;
  if (r >= a.D) return;
  const ExpertSlot& slot = a.slots[a.ids[p]];
  const float v = row_dot1<F>(slot.w2, r, a.act + p * a.inter);
  if (lane == 0) a.y[p * a.D + r] = v;
}

#define AFF_MOE_KERNELS(fmt_name, F)                                                              \
  __global__ void __launch_bounds__(kRowsPerBlock * 32) moe_up_##fmt_name##_f32_sm90(ExpertFfnArgs a) { \
    moe_up_body<F>(a);                                                                            \
  }                                                                                               \
  __global__ void __launch_bounds__(kRowsPerBlock * 32) moe_down_##fmt_name##_f32_sm90(ExpertFfnArgs a) { \
    moe_down_body<F>(a);                                                                          \
  }
AFF_MOE_KERNELS(mxfp4, DevFormat::kMXFP4)
AFF_MOE_KERNELS(fp8b, DevFormat::kFP8Block)
AFF_MOE_KERNELS(bf16, DevFormat::kBF16)
AFF_MOE_KERNELS(f16, DevFormat::kF16)
AFF_MOE_KERNELS(f32, DevFormat::kF32)
AFF_MOE_KERNELS(ggml, DevFormat::kGgml)
AFF_MOE_KERNELS(q8, DevFormat::kQ8)
#undef AFF_MOE_KERNELS

using MoeKernel = void (*)(ExpertFfnArgs);
struct MoeKernels {
  MoeKernel up = nullptr, down = nullptr;
};

MoeKernels select_moe_kernels(DevFormat f) {
  switch (f) {
    case DevFormat::kMXFP4: return {moe_up_mxfp4_f32_sm90, moe_down_mxfp4_f32_sm90};
    case DevFormat::kFP8Block: return {moe_up_fp8b_f32_sm90, moe_down_fp8b_f32_sm90};
    case DevFormat::kBF16: return {moe_up_bf16_f32_sm90, moe_down_bf16_f32_sm90};
    case DevFormat::kF16: return {moe_up_f16_f32_sm90, moe_down_f16_f32_sm90};
    case DevFormat::kF32: return {moe_up_f32_f32_sm90, moe_down_f32_f32_sm90};
    case DevFormat::kGgml: return {moe_up_ggml_f32_sm90, moe_down_ggml_f32_sm90};
    case DevFormat::kQ8: return {moe_up_q8_f32_sm90, moe_down_q8_f32_sm90};
  }
  return {};
}

__global__ void moe_combine_f32_sm90(const float* weights, const float* y, int64_t T, int k, int64_t D,
                                     const float* add, float* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= T * D) return;
  const int64_t t = i / D, d = i % D;
  float s = 0.0f;
  for (int j = 0; j < k; ++j) s = fmaf(weights[t * k + j], y[(t * k + j) * D + d], s);
  if (add) s += add[i];
  out[i] = s;
}

}  // namespace

Status expert_ffn(const ExpertFfnArgs& a, cudaStream_t stream) {
  if (a.n_pairs == 0) return Status::ok();
  if (a.n_pairs > 65535) return internal_error("expert_ffn: too many pairs in one launch");
  const MoeKernels k = select_moe_kernels(a.format);
  if (!k.up) return internal_error("expert_ffn: no kernel for the experts' format");
  const dim3 up_grid(unsigned((a.inter + kRowsPerBlock - 1) / kRowsPerBlock), unsigned(a.n_pairs));
  k.up<<<up_grid, kRowsPerBlock * 32, 0, stream>>>(a);
  AFF_RETURN_IF_ERROR(launch_status("moe_up"));
  const dim3 down_grid(unsigned((a.D + kRowsPerBlock - 1) / kRowsPerBlock), unsigned(a.n_pairs));
  k.down<<<down_grid, kRowsPerBlock * 32, 0, stream>>>(a);
  return launch_status("moe_down");
}

Status moe_combine(const float* weights, const float* y, int64_t T, int k, int64_t D, const float* add,
                   float* out, cudaStream_t stream) {
  const int64_t n = T * D;
  if (n == 0) return Status::ok();
  moe_combine_f32_sm90<<<unsigned((n + 255) / 256), 256, 0, stream>>>(weights, y, T, k, D, add, out);
  return launch_status("moe_combine_f32_sm90");
}

}  // namespace aff::cuda
