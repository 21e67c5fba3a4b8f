// The streaming decode MoE (moe_decode_fast.cu): the layout the V4 decode runs
// (routed experts in Q2_K / Q3_K / IQ2_XXS gate-up and Q2_K / Q3_K down, shared
// expert in FP8 with block scales). moe_decode_up/down (moe_decode.cu) take it
// when moe_fast_supported says so and the general kernels otherwise; the choice
// depends on the arguments only, so the two launches always agree on the
// layout of the act scratch between them.
#pragma once

#include <cuda_runtime.h>

#include "affinity/status.h"
#include "backend/cuda/kernels/moe/moe.h"

namespace aff::cuda {

// Most tokens the streaming kernels take (the decode step and up to 7 draft
// tokens); every T up to it passed the GPU tests.
constexpr int64_t kMoeFastMaxTokens = 8;

bool moe_fast_supported(const MoeDecodeArgs& m);
Status moe_fast_up(const MoeDecodeArgs& m, cudaStream_t stream);
Status moe_fast_down(const MoeDecodeArgs& m, cudaStream_t stream);
// Raises the kernels' dynamic shared-memory limits (before graph capture).
Status moe_fast_prepare();

}  // namespace aff::cuda
