// V4 attention core on the device: one shared KV latent (K = V) per position,
// keys = the sliding window (ring + this chunk) and, on compressed layers,
// compressed entries (all visible ones for HCA, the indexer's choice for CSA),
// with a learned sink logit per head. Output is before de-rotation.
//
// All heads of a query attend to the same keys, so per query the work is two
// small GEMMs with the heads as rows: S = Q[H, Dh] K^T, O = softmax(S) K. The
// kernel runs them on bf16 tensor cores; keys are split over blocks
// (flash-decoding) when there are too few queries to fill the GPU, and the
// partial results are merged by a second kernel.
//
// Graph-safe: the chunk's position and length are read from StepInfo in device
// memory, every count that depends on them is derived on the device, and the
// grid depends only on capacities, so one captured decode step replays for
// every position.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "affinity/status.h"
#include "backend/cuda/kernels/gemm/mma_precision.h"
#include "backend/cuda/runtime/step_info.h"

namespace aff::cuda {

enum class AttnEntries : int32_t {
  kNone,      // sliding-window layer
  kVisible,   // HCA: every entry j < (pos + 1) / ratio
  kSelected,  // CSA: the ids in sel[t, 0..count[t])
};

struct AttentionArgs {
  const StepInfo* step = nullptr;  // device: pos0 and T of this chunk
  const float* q = nullptr;        // [T, H, Dh] queries (normed, RoPE'd; raw with q_finish)
  const float* kv = nullptr;       // [T, Dh] the chunk's KV latents (normed, RoPE'd)
  const float* ring = nullptr;     // [W, Dh] window ring: position p < pos0 at row p % W
  const float* entries = nullptr;  // [entry_capacity, Dh] compressed entries
  int64_t entry_capacity = 0;      // rows of `entries` (bounds kVisible; sizes the split grid)
  // kVisible: the most entries visible in any step the launch serves (a
  // captured decode step replays over a range of positions), sizing the split
  // grid instead of the capacity; 0: entry_capacity.
  int64_t entry_bound = 0;
  int ratio = 0;
  AttnEntries mode = AttnEntries::kNone;
  const int32_t* sel = nullptr;        // [T, sel_ld] (kSelected)
  const int32_t* sel_count = nullptr;  // [T], each <= sel_ld
  int sel_ld = 0;
  const float* sinks = nullptr;    // [H] sink logits
  int64_t T = 0;                   // queries the launch is sized for (>= step->T)
  int H = 0, Dh = 0, W = 0;
  float scale = 1.0f;              // 1 / sqrt(Dh)
  MmaPrecision precision = MmaPrecision::kBf16x3;
  float* out = nullptr;            // [T, H, Dh]
  // Scratch for the key-split partials: [T, splits, H, Dh + 2] f32. With less
  // than one split's worth per query the keys are not split.
  float* scratch = nullptr;
  int64_t scratch_floats = 0;
  // Set: the output's trailing rope_dim channels are rotated back by query t's
  // angle (position step->pos0 + t, frequencies [rope_dim / 2]), as rope_f32
  // with inverse = true would do after the call (V carried RoPE on its tail).
  // The key-split merge does it as it writes; otherwise rope_f32 runs.
  const float* unrope_freq = nullptr;
  int rope_dim = 0;
  // Set: q holds the raw query rows, and the kernel finishes them as it
  // stages them: each head row RMS-normalised (no weight, eps q_eps), then
  // its trailing rope_dim channels rotated by the query's angle with the
  // unrope_freq frequencies, as qkv_finish does (one launch fewer on a decode
  // step's query path). Only where attention_finishes_q says so.
  bool q_finish = false;
  float q_eps = 0.0f;
};

// out[t, h] = sum_i softmax_i(q . k_i * scale; sink) k_i, with the sink in the
// denominator only. Dh <= 512, Dh % 8 == 0; any H (in groups of 64).
Status attention_sparse(const AttentionArgs& a, cudaStream_t stream);

// Whether a launch with these arguments can take q_finish: decode-sized
// chunks (T <= 16), a head row staged by whole warps (Dh in (64, 128],
// (192, 256] or (256, 512]), a rope tail of whole float4s, frequencies given.
bool attention_finishes_q(const AttentionArgs& a);

// Number of key splits attention_sparse uses for these arguments (for tests
// and benchmarks: a pure function of the capacities, never of the position).
int attention_splits(const AttentionArgs& a);

}  // namespace aff::cuda
