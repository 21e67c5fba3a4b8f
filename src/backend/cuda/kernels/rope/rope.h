// Rotary embedding as V4 uses it: interleaved pairs (v[2i], v[2i+1]) on the
// trailing rope dims of each vector; inverse frequencies (plain or YaRN) are
// computed on the host (backend/ref/rope.h) and passed as a device array.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "affinity/status.h"
#include "backend/cuda/runtime/step_info.h"

namespace aff::cuda {

struct RopeArgs {
  float* x = nullptr;          // rows of `stride` floats; the rope tail starts at `offset`
  int64_t rows = 0;
  int64_t stride = 0;
  int64_t offset = 0;          // = vector length - rope_dim for the trailing dims
  const float* inv_freq = nullptr;  // [half] device
  int half = 0;                // rope_dim / 2
  int rows_per_pos = 1;        // row r has position base + pos0 + (r / rows_per_pos) * pos_step,
  int64_t pos0 = 0;            //   base = step->pos0 when `step` is set (the chunk's start), else 0
  const StepInfo* step = nullptr;
  int64_t pos_step = 1;
  bool inverse = false;        // rotate by the negative angle (output de-rotation)
};

Status rope_f32(const RopeArgs& a, cudaStream_t stream);

}  // namespace aff::cuda
