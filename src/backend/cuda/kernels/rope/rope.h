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

// The attention inputs' last step in one launch: per part, rows of `len`
// floats, `rows_per_token` rows per chunk token (heads), optionally rmsnorm'd
// (times norm_weight when set), then RoPE on the trailing rope_dim dims at the
// token's position StepInfo.pos0 + t. Rows take the vectorised kernel (a warp
// per row, one sin/cos table per token and block) when rope_dim and every
// part's len are multiples of 4 and every x and norm_weight is 16-byte
// aligned; otherwise a block per row.
struct QkvPart {
  float* x = nullptr;                // [T, rows_per_token, len], in place
  int rows_per_token = 1;
  int len = 0;                       // <= 1024
  bool norm = false;
  const float* norm_weight = nullptr;  // [len] or null
  const float* inv_freq = nullptr;   // [rope_dim/2] device
};

struct QkvFinishArgs {
  QkvPart parts[3];                  // e.g. queries [T, H, Dh], KV latents [T, 1, Dh], indexer queries
  int n_parts = 0;
  const StepInfo* step = nullptr;
  int64_t T = 0;
  int rope_dim = 0;
  float eps = 1e-6f;
};

Status qkv_finish(const QkvFinishArgs& a, cudaStream_t stream);

}  // namespace aff::cuda
