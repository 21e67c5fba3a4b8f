// KV compressor (CSA/HCA attention entries and CSA indexer keys) on the device.
// Streaming state is a ring of the last 2*ratio tokens' projections (gate rows
// already carry ape), so a chunk of any length can complete several entries in
// one launch: a slot's row comes from the chunk when its position is in the
// chunk, else from the ring.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "affinity/status.h"

namespace aff::cuda {

struct CompressorPoolArgs {
  const float* kv = nullptr;        // [T, width] the chunk's wkv projections, width = (overlap ? 2 : 1) * dim
  const float* gate = nullptr;      // [T, width] the chunk's wgate logits (no ape)
  const float* ape = nullptr;       // [ratio, width]
  const float* ring_kv = nullptr;   // [2*ratio, width]; position p at row p % (2*ratio)
  const float* ring_gate = nullptr; // [2*ratio, width], ape included
  int64_t pos0 = 0, T = 0;          // the chunk covers positions [pos0, pos0 + T)
  int ratio = 0, dim = 0;
  bool overlap = false;             // ratio 4 (CSA): entry b also pools block b-1's first halves
  int64_t first_entry = 0, n_new = 0;  // entries [first_entry, first_entry + n_new) are completed
  float* entries = nullptr;         // [capacity, dim]; entry b written at row b (raw pool, before norm/RoPE)
};

// Softmax-gated pooling per channel of each completed entry (as the reference:
// max, then sum of exp(g - max) and exp-weighted values, then divide).
Status compressor_pool(const CompressorPoolArgs& a, cudaStream_t stream);

struct RingStoreArgs {
  const float* src = nullptr;  // [T, width]
  const float* add = nullptr;  // [period, width] added to the row of position p at p % period, or null
  int period = 1;
  float* ring = nullptr;       // [capacity, width]; position p at row p % capacity
  int64_t capacity = 0;
  int64_t pos0 = 0, T = 0;
  int64_t width = 0;
};

// Stores the chunk's last min(T, capacity) rows into the ring (attention
// window ring; compressor rings with add = ape for the gate rows).
Status ring_store(const RingStoreArgs& a, cudaStream_t stream);

}  // namespace aff::cuda
