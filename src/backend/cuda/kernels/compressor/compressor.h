// KV compressor (CSA/HCA attention entries and CSA indexer keys) on the device.
// Streaming state is a ring of the last 2*ratio tokens' projections (gate rows
// already carry ape), so a chunk of any length can complete several entries in
// one launch: a slot's row comes from the chunk when its position is in the
// chunk, else from the ring.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "affinity/status.h"
#include "backend/cuda/runtime/step_info.h"

namespace aff::cuda {

struct CompressorPoolArgs {
  const float* kv = nullptr;        // [T, width] the chunk's wkv projections, width = (overlap ? 2 : 1) * dim
  const float* gate = nullptr;      // [T, width] the chunk's wgate logits (no ape)
  const float* ape = nullptr;       // [ratio, width]
  float* ring_kv = nullptr;         // [2*ratio, width]; position p at row p % (2*ratio)
  float* ring_gate = nullptr;       // [2*ratio, width], ape included (written only with store_ring)
  const StepInfo* step = nullptr;   // device: the chunk covers positions [pos0, pos0 + T)
  int64_t T = 0;                    // the chunk's length (host copy of step->T, sizes the grid)
  int ratio = 0, dim = 0;
  bool overlap = false;             // ratio 4 (CSA): entry b also pools block b-1's first halves
  const float* norm = nullptr;      // [dim] rmsnorm weight of a finished entry
  float eps = 1e-6f;
  const float* inv_freq = nullptr;  // [rope_dim/2] RoPE on the entry's trailing rope_dim dims,
  int rope_dim = 0;                 //   at the entry's first position (entry * ratio)
  float* entries = nullptr;         // [capacity, dim]; entry b written at row b, finished
  // T == 1 only (a decode step): the same launch also stores the token's kv
  // and gate (+ ape) rows into the rings, as two ring_store launches would.
  // With more tokens a later token's store could overwrite a row an entry
  // still pools, so longer chunks store after the pool.
  bool store_ring = false;
  // T == 1 only: the projections were deferred to the step that completes a
  // unit of compressor_defer_rows(ratio) positions. kv and gate then
  // hold the unit's rows, ending at the current position, and are valid only
  // in a step that completes the unit; with store_ring, that step stores all
  // of them, and an entry it completes reads its block's earlier units (and
  // the older half of an overlapped window) from the rings. A step that
  // completes no unit does nothing.
  bool deferred = false;
};

// Rows of x a decode step's deferred projections collect before one launch
// projects them (GpuCompressorState::ring_x holds them): the most tokens the
// exact BF16 tensor-core GEMV takes per launch, so the weights are read once
// per unit. A ratio-4 compressor (CSA's, the indexer's) projects once per
// entry; a ratio-128 one (HCA's) once per 4 tokens instead of every token.
constexpr int kCompressorDeferRows = 4;

// The unit a compressor of this ratio defers its projections over (0: none).
__host__ __device__ constexpr int compressor_defer_rows(int ratio) {
  return ratio % kCompressorDeferRows == 0 ? kCompressorDeferRows : ratio <= kCompressorDeferRows ? ratio : 0;
}

// Completes every entry the chunk finishes (ids from StepInfo, so a captured
// decode step completes one exactly when its position closes a block):
// softmax-gated pooling per channel (max, then sum of exp(g - max) and
// exp-weighted values, then divide, as the reference), then rmsnorm and RoPE.
// dim <= 1024.
Status compressor_pool(const CompressorPoolArgs& a, cudaStream_t stream);

struct RingStoreArgs {
  const float* src = nullptr;  // [T, width]
  const float* add = nullptr;  // [period, width] added to the row of position p at p % period, or null
  int period = 1;
  float* ring = nullptr;       // [capacity, width]; position p at row p % capacity
  int64_t capacity = 0;
  const StepInfo* step = nullptr;  // device: positions [pos0, pos0 + T)
  int64_t T = 0;                   // host copy of step->T
  int64_t width = 0;
  int64_t pos_offset = 0;          // row t is position step->pos0 + pos_offset + t
};

// Stores the chunk's last min(T, capacity) rows into the ring (attention
// window ring; compressor rings with add = ape for the gate rows).
Status ring_store(const RingStoreArgs& a, cudaStream_t stream);

}  // namespace aff::cuda
