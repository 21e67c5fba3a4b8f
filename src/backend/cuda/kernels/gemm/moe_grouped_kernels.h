// Launchers of the device pieces of moe_grouped_ffn (moe_grouped_kernels.cu).
// Internal to kernels/gemm.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "affinity/status.h"

namespace aff::cuda {

// counts: [E] pairs per expert (ids outside [0, E) are not counted).
Status moe_count(const int32_t* ids, int64_t n_pairs, int E, int32_t* counts, cudaStream_t s);

// offsets: [E] first sorted slot of each expert; cursor: [E] scratch.
// slot_of_pair: [n_pairs] (-1 for an out-of-range id); pair_of_slot: [n_pairs].
Status moe_place(const int32_t* ids, int64_t n_pairs, int E, const int32_t* offsets, int32_t* cursor,
                 int32_t* slot_of_pair, int32_t* pair_of_slot, cudaStream_t s);

// hi/lo: [n_slots, D] bf16 of x[pair_of_slot[slot] / ppt] (lo may be null).
Status moe_gather_bf16(const float* x, int64_t D, int ppt, const int32_t* pair_of_slot, int64_t n_slots,
                       uint16_t* hi, uint16_t* lo, cudaStream_t s);

// hi/lo: [n] bf16 of silu(min(g, L)) * clamp(u, -L, L) (lo may be null).
Status moe_swiglu_bf16(const float* gate, const float* up, int64_t n, float limit, uint16_t* hi, uint16_t* lo,
                       cudaStream_t s);

// y: [n_pairs, D] f32 = y_sorted[slot_of_pair[p]] (0 for slot -1).
Status moe_scatter(const float* y_sorted, const int32_t* slot_of_pair, int64_t n_pairs, int64_t D, float* y,
                   cudaStream_t s);

}  // namespace aff::cuda
