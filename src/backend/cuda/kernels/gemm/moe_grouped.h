// Routed experts for prefill on tensor cores: the (token, expert) pairs of a
// chunk are grouped by expert on the device, so each active expert's weights
// are decoded and read once per chunk and multiplied against all of its tokens
// (cuBLAS, bf16 in, f32 out): gate and up, the clamped SwiGLU, then down.
// Same contract as expert_ffn (kernels/moe/moe.h); the weighted combine stays
// with moe_combine.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <span>

#include "affinity/status.h"
#include "backend/cuda/kernels/gemm/mma_precision.h"
#include "backend/cuda/runtime/device_weights.h"

namespace aff::cuda {

// Fewest tokens for which gpu_moe groups the experts. From the H200 bench
// (tests/gpu/attention_bench_test.cpp): a pair costs ~100 us on the per-pair
// GEMV at V4-Flash width, an active expert ~60 us here (three decodes, three
// GEMMs), so grouping wins from about 8 tokens x 6 pairs; 32 leaves the short
// chunks to the decode kernels.
constexpr int64_t kGroupedMoeMinTokens = 32;

struct GroupedMoeArgs {
  std::span<const ExpertSlot> slots;   // host copy of the slot table [E] (device or host-mapped pointers)
  const int32_t* ids = nullptr;        // device [n_pairs] expert of pair p (token p / pairs_per_token)
  int64_t n_pairs = 0;
  int pairs_per_token = 1;
  const float* x = nullptr;            // device [n_pairs / pairs_per_token, D] expert input
  int64_t D = 0, inter = 0;            // hidden size, expert intermediate size
  float swiglu_limit = 0.0f;           // 0 disables the clamp
  float* y = nullptr;                  // device out [n_pairs, D], unweighted expert outputs
};

// Whether every expert of the table can take this path at this precision.
bool moe_grouped_supports(std::span<const ExpertSlot> slots, MmaPrecision precision);

// y[p] = w2 (silu(min(w1 x, L)) * clamp(w3 x, -L, L)) for every pair p. Reads
// the per-expert counts back to the host (one synchronisation): prefill only,
// never inside a captured graph.
Status moe_grouped_ffn(const GroupedMoeArgs& a, MmaPrecision precision, cudaStream_t stream);

}  // namespace aff::cuda
