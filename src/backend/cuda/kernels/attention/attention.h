// V4 attention core on the device: one shared KV latent (K = V) per position,
// keys = the sliding window (ring + this chunk) and, on compressed layers,
// compressed entries (all visible ones for HCA, the indexer's choice for CSA),
// with a learned sink logit per head. Output is before de-rotation.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "affinity/status.h"

namespace aff::cuda {

enum class AttnEntries : int32_t {
  kNone,      // sliding-window layer
  kVisible,   // HCA: every entry j < (pos + 1) / ratio
  kSelected,  // CSA: the ids in sel[t, 0..count[t])
};

struct AttentionArgs {
  const float* q = nullptr;        // [T, H, Dh] queries (normed, RoPE'd)
  const float* kv = nullptr;       // [T, Dh] the chunk's KV latents (normed, RoPE'd)
  const float* ring = nullptr;     // [W, Dh] window ring: position p < pos0 at row p % W
  const float* entries = nullptr;  // [n_entries, Dh] compressed entries
  int64_t n_entries = 0;
  int ratio = 0;
  AttnEntries mode = AttnEntries::kNone;
  const int32_t* sel = nullptr;    // [T, sel_ld] (kSelected)
  const int32_t* sel_count = nullptr;  // [T]
  int sel_ld = 0;
  const float* sinks = nullptr;    // [H] sink logits
  int64_t T = 0, pos0 = 0;
  int H = 0, Dh = 0, W = 0;
  float scale = 1.0f;              // 1 / sqrt(Dh)
  float* out = nullptr;            // [T, H, Dh]
};

// out[t, h] = sum_i softmax_i(q . k_i * scale; sink) k_i, with the sink in the
// denominator only. Dh <= 512.
Status attention_sparse(const AttentionArgs& a, cudaStream_t stream);

}  // namespace aff::cuda
