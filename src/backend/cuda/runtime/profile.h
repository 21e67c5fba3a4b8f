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

}  // namespace aff::cuda
