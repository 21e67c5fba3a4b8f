// The experts' clamped SwiGLU, one home for every MoE kernel: the gate is
// clamped from above and the up projection to [-limit, limit] (limit 0: no
// clamp), then silu(gate) * up, as the reference (model/dsv4/moe).
#pragma once

#include <cuda_runtime.h>

namespace aff::cuda {

__device__ __forceinline__ float swiglu_clamp(float g, float u, float limit) {
  if (limit > 0.0f) {
    g = fminf(g, limit);
    u = fminf(fmaxf(u, -limit), limit);
  }
  return g / (1.0f + expf(-g)) * u;
}

}  // namespace aff::cuda
