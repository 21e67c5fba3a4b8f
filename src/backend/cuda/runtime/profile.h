// Where a forward pass spends its GPU time, without a profiler: with
// AFF_CUDA_PROFILE=1 the forward pass records a CUDA event after each named
// stage, and at exit prints, per stage name, the summed time between the
// previous mark and that one. Steps then run launch by launch (no graph), so
// gaps where the GPU waits for the host are charged to the stage after them.
// Disabled (the default), a mark is one branch on a cached flag.
#pragma once

#include <cuda_runtime.h>

namespace aff::cuda {

bool profiling_enabled();
// Marks the end of stage `name` on `stream` (a string literal: it is kept).
void prof_mark(cudaStream_t stream, const char* name);
// Ends a step: waits for the stream and adds the step's intervals to the totals.
void prof_step_end(cudaStream_t stream);

// What-if timing: AFF_CUDA_ABLATE=stage[,stage...] leaves those stages'
// launches out of the forward pass, so a decode benchmark shows what each
// stage adds to the captured step, overlap included. The outputs are then
// meaningless. Stages: mhc, wq_a, entries (compressors and indexer; or its
// parts comp, icomp, iw, iq, isel), wq_b, qkv, attn, ring, wo_a, wo_b,
// shared, router, moe_up, moe_down, head; and sinkhorn (the mHC sites run one
// Sinkhorn iteration instead of the model's count).
bool ablated(const char* stage);

}  // namespace aff::cuda
