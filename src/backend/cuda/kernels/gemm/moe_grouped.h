// Routed experts for prefill on tensor cores: the (token, expert) pairs of a
// chunk are grouped by expert on the device, so each active expert's weights
// are decoded and read once per chunk (per 64 of its tokens, ggml) and
// multiplied against all of its tokens: gate and up, the clamped SwiGLU, then
// down. Same contract as expert_ffn (kernels/moe/moe.h); the weighted combine
// stays with moe_combine.
//
// Two implementations behind one call:
//  - ggml experts (every matrix kGgml, one type per matrix across the table,
//    D and inter multiples of 256): two fused launches over (expert, 64
//    tokens) tiles that decode the weights into shared memory on the fly and
//    apply the SwiGLU in the first launch's epilogue (moe_grouped_ggml.h;
//    two kernel forms, moe_grouped_set_ggml_kernel).
//    Precision: x and the SwiGLU output are rounded to bf16 once (hi only) in
//    both MmaPrecision settings; the weights round to bf16 when decoded. The
//    decode-time kernels for these formats quantise x to int8 per 32, so this
//    is already more precise than the path that serves them at T <= 8.
//  - the rest (FP8 block, MXFP4, BF16, F32/F16 in kBf16, and ggml tables the
//    fused kernels do not take): per active expert, w decoded to bf16 once and
//    cuBLAS (bf16 in, f32 out); x and the SwiGLU output as hi + lo bf16 in
//    kBf16x3 (two GEMMs per matrix), hi in kBf16.
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
  bool ids_all_zero = false;           // every id is 0 (one-expert table, e.g. the shared expert):
                                       // the count is P and need not be read back
};

// Whether every expert of the table can take this path at this precision.
bool moe_grouped_supports(std::span<const ExpertSlot> slots, MmaPrecision precision);

// y[p] = w2 (silu(min(w1 x, L)) * clamp(w3 x, -L, L)) for every pair p. Reads
// the per-expert counts back to the host (one synchronisation): prefill only,
// never inside a captured graph.
Status moe_grouped_ffn(const GroupedMoeArgs& a, MmaPrecision precision, cudaStream_t stream);

// Process-wide: whether ggml experts take the fused kernels (default on). Off
// sends them through the per-expert decode + cuBLAS path, which tests and the
// benchmark use as a second implementation to compare against.
void moe_grouped_set_ggml_fused(bool on);
bool moe_grouped_ggml_fused();

// Process-wide: which form of the fused ggml kernels runs (1: decoded weights
// through a shared bf16 tile, moe_ggml_up / moe_ggml_down; 2: decoded straight
// into MMA registers, moe_ggml_up_v2 / moe_ggml_down_v2, for the types that
// form takes, the first form for the rest). The default is 2 (4.10 against
// 4.98 ms for a V4 layer's 2,048-token chunk), or 1 when the environment
// variable AFF_CUDA_MOE_PREFILL is "v1" (read once, at the first call of either
// function); a set call overrides it. Other values are ignored.
void moe_grouped_set_ggml_kernel(int version);
int moe_grouped_ggml_kernel();

}  // namespace aff::cuda
