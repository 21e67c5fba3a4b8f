// Programmatic dependent launch (sm_90): a kernel launched with launch_pdl may
// start while the kernel before it on the stream is still running, and must
// call pdl_wait() before it reads anything an earlier kernel wrote (or writes
// anything an earlier kernel reads). What it does before pdl_wait() must touch
// only data no kernel of the step writes: weights, tables, constants.
//
// Why: a decode step is ~25 short kernels per layer, and between two
// dependent kernels the GPU idles for the second's launch and ramp-up. Weight
// streaming kernels issue their first weight loads before pdl_wait(), so the
// next projection's reads start during the previous kernel's tail. Captured
// into a CUDA graph, the launch attribute becomes a programmatic edge.
//
// A kernel calls pdl_launch_dependents() once it no longer needs its SM
// resources to be exclusive (its whole grid is resident): the next kernel's
// blocks may then be scheduled and run their prologue. pdl_wait() still waits
// for this kernel to finish and its writes to be visible, so correctness never
// depends on where the trigger is placed. Both are no-ops for a kernel
// launched without the attribute.
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace aff::cuda {

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void pdl_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

// The prologue of a kernel with nothing to do before the wait: lets the next
// kernel be scheduled, then waits for the previous one.
__device__ __forceinline__ void pdl_start() {
  pdl_launch_dependents();
  pdl_wait();
}

// kernel<<<grid, block, smem, stream>>>(args...) with the programmatic
// stream serialization attribute. Returns the launch error (the caller wraps
// it with launch_status-style naming).
template <typename... KArgs, typename... Args>
cudaError_t launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                       Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace aff::cuda
