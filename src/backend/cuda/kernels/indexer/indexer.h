// Lightning indexer of CSA layers: scores of every visible compressed key for
// every query, then each query's top-k entry ids.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "affinity/status.h"

namespace aff::cuda {

struct IndexerScoreArgs {
  const float* q = nullptr;     // [T, nh, hd] indexer queries (RoPE applied)
  const float* w = nullptr;     // [T, nh] per-head weights (weights_proj x)
  float w_scale = 1.0f;         // 1/sqrt(hd)/sqrt(nh), folded into w as the reference does
  const float* keys = nullptr;  // [n_entries, hd] indexer compressor entries
  int64_t T = 0, pos0 = 0, n_entries = 0;
  int nh = 0, hd = 0, ratio = 0;
  float* scores = nullptr;      // out [T, n_entries]: sum_h w[t,h] relu(q[t,h] . k[j]); -inf where not visible
};

// Entry j is visible to the query at position p when j < (p + 1) / ratio.
Status indexer_scores(const IndexerScoreArgs& a, cudaStream_t stream);

struct TopkArgs {
  const float* scores = nullptr;  // [T, ld] (only the first n_vis(t) of each row are read)
  int64_t ld = 0;
  int64_t T = 0, pos0 = 0, n_entries = 0;
  int ratio = 0, k = 0;
  int32_t* sel = nullptr;         // out [T, k] chosen ids, in increasing id order
  int32_t* count = nullptr;       // out [T] = min(k, n_vis(t))
};

// The k highest scores among the visible entries (ties: lower id first), or
// all visible entries when there are at most k. Radix select on the ordered
// bit pattern, then an ordered compaction: deterministic, O(n) per query.
Status indexer_topk(const TopkArgs& a, cudaStream_t stream);

}  // namespace aff::cuda
