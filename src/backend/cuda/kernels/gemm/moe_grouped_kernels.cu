// Device pieces of moe_grouped_ffn: the counting sort of pairs by expert,
// the gather of each pair's input row into sorted bf16 rows, the clamped
// SwiGLU between the GEMMs, and the scatter of sorted outputs back to pairs.
#include "backend/cuda/kernels/gemm/mma_bf16.cuh"
#include "backend/cuda/kernels/gemm/moe_grouped_kernels.h"
#include "backend/cuda/kernels/moe/swiglu.cuh"
#include "backend/cuda/runtime/cuda_check.h"

namespace aff::cuda {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) { return unsigned((n + kThreads - 1) / kThreads); }

__global__ void moe_count_sm90(const int32_t* ids, int64_t n_pairs, int E, int32_t* counts) {
  const int64_t p = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (p < n_pairs) {
    const int32_t e = ids[p];
    if (e >= 0 && e < E) atomicAdd(&counts[e], 1);
  }
}

// slot = offsets[e] + running rank; the order inside one expert does not
// change any result (each output row depends on its own input row only).
__global__ void moe_place_sm90(const int32_t* ids, int64_t n_pairs, int E, const int32_t* offsets, int32_t* cursor,
                               int32_t* slot_of_pair, int32_t* pair_of_slot) {
  const int64_t p = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (p >= n_pairs) return;
  const int32_t e = ids[p];
  if (e < 0 || e >= E) {
    slot_of_pair[p] = -1;
    return;
  }
  const int32_t slot = offsets[e] + atomicAdd(&cursor[e], 1);
  slot_of_pair[p] = slot;
  pair_of_slot[slot] = int32_t(p);
}

__global__ void moe_gather_bf16_sm90(const float* x, int64_t D, int ppt, const int32_t* pair_of_slot, int64_t n_slots,
                                     uint16_t* hi, uint16_t* lo) {
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n_slots * D) return;
  const int64_t slot = i / D, d = i % D;
  uint16_t h, l;
  split_bf16(x[int64_t(pair_of_slot[slot] / ppt) * D + d], h, l);
  hi[i] = h;
  if (lo != nullptr) lo[i] = l;
}

__global__ void moe_swiglu_bf16_sm90(const float* gate, const float* up, int64_t n, float limit, uint16_t* hi,
                                     uint16_t* lo) {
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n) return;
  uint16_t h, l;
  split_bf16(swiglu_clamp(gate[i], up[i], limit), h, l);
  hi[i] = h;
  if (lo != nullptr) lo[i] = l;
}

__global__ void moe_scatter_sm90(const float* y_sorted, const int32_t* slot_of_pair, int64_t n_pairs, int64_t D,
                                 float* y) {
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n_pairs * D) return;
  const int64_t p = i / D, d = i % D;
  const int32_t slot = slot_of_pair[p];
  y[i] = slot >= 0 ? y_sorted[int64_t(slot) * D + d] : 0.0f;
}

}  // namespace

Status moe_count(const int32_t* ids, int64_t n_pairs, int E, int32_t* counts, cudaStream_t s) {
  AFF_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(counts, 0, size_t(E) * 4, s));
  moe_count_sm90<<<blocks_for(n_pairs), kThreads, 0, s>>>(ids, n_pairs, E, counts);
  return launch_status("moe_count_sm90");
}

Status moe_place(const int32_t* ids, int64_t n_pairs, int E, const int32_t* offsets, int32_t* cursor,
                 int32_t* slot_of_pair, int32_t* pair_of_slot, cudaStream_t s) {
  AFF_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(cursor, 0, size_t(E) * 4, s));
  moe_place_sm90<<<blocks_for(n_pairs), kThreads, 0, s>>>(ids, n_pairs, E, offsets, cursor, slot_of_pair,
                                                          pair_of_slot);
  return launch_status("moe_place_sm90");
}

Status moe_gather_bf16(const float* x, int64_t D, int ppt, const int32_t* pair_of_slot, int64_t n_slots,
                       uint16_t* hi, uint16_t* lo, cudaStream_t s) {
  if (n_slots == 0) return Status::ok();
  moe_gather_bf16_sm90<<<blocks_for(n_slots * D), kThreads, 0, s>>>(x, D, ppt, pair_of_slot, n_slots, hi, lo);
  return launch_status("moe_gather_bf16_sm90");
}

Status moe_swiglu_bf16(const float* gate, const float* up, int64_t n, float limit, uint16_t* hi, uint16_t* lo,
                       cudaStream_t s) {
  if (n == 0) return Status::ok();
  moe_swiglu_bf16_sm90<<<blocks_for(n), kThreads, 0, s>>>(gate, up, n, limit, hi, lo);
  return launch_status("moe_swiglu_bf16_sm90");
}

Status moe_scatter(const float* y_sorted, const int32_t* slot_of_pair, int64_t n_pairs, int64_t D, float* y,
                   cudaStream_t s) {
  if (n_pairs == 0) return Status::ok();
  moe_scatter_sm90<<<blocks_for(n_pairs * D), kThreads, 0, s>>>(y_sorted, slot_of_pair, n_pairs, D, y);
  return launch_status("moe_scatter_sm90");
}

}  // namespace aff::cuda
