// A barrier among the blocks of one launch, for launches whose blocks are all
// resident at once (a grid no larger than what fits on the GPU in one wave):
// each block arrives once on a counter, and waits until it reaches the grid's
// block count. Counters live in global memory, are zero at launch and are
// reset by the launch itself once every block is past its last wait.
#pragma once

namespace aff::cuda {

// This block's writes so far are visible to any block that waits on ctr.
__device__ __forceinline__ void grid_arrive(unsigned* ctr) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) atomicAdd(ctr, 1u);
}

// Returns (to the whole block) once ctr has n arrivals. Thread 0 polls with
// acquire loads (atomics from every block on one word would serialise).
__device__ __forceinline__ void grid_wait(const unsigned* ctr, unsigned n) {
  if (threadIdx.x == 0) {
    unsigned seen = 0;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(seen) : "l"(ctr) : "memory");
    } while (seen < n);
  }
  __syncthreads();
}

}  // namespace aff::cuda
