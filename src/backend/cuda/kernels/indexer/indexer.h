// Lightning indexer of CSA layers: scores of every visible compressed key for
// every query, then each query's top-k entry ids.
//
// Graph-safe: positions come from StepInfo in device memory, buffers are laid
// out by capacity (not by how many entries exist now), and grids depend only
// on capacities, so one captured decode step replays for every position.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "affinity/status.h"
#include "backend/cuda/kernels/gemm/mma_precision.h"
#include "backend/cuda/runtime/step_info.h"

namespace aff::cuda {

struct IndexerScoreArgs {
  const StepInfo* step = nullptr;  // device: the chunk's pos0 and T
  const float* q = nullptr;     // [T, nh, hd] indexer queries (RoPE applied)
  const float* w = nullptr;     // [T, nh] per-head weights (weights_proj x), or null:
  const float* w_parts = nullptr;  // [T, w_nparts, nh] their partial sums, added in order
  int w_nparts = 0;
  float w_scale = 1.0f;         // 1/sqrt(hd)/sqrt(nh), folded into w as the reference does
  const float* keys = nullptr;  // [capacity, hd] indexer compressor entries
  int64_t T = 0;                // queries the launch is sized for (>= step->T)
  int64_t capacity = 0;         // rows of keys, and the row stride of scores
  int nh = 0, hd = 0, ratio = 0;
  MmaPrecision precision = MmaPrecision::kBf16x3;
  float* scores = nullptr;      // out [T, capacity]: sum_h w[t,h] relu(q[t,h] . k[j]) for visible j
  // Non-null: q is given without its RoPE, which the kernel applies as it
  // loads q (the trailing rope_dim dims of each head, interleaved pairs, at
  // position step->pos0 + t; qkv_finish's arithmetic). [rope_dim / 2] device.
  const float* rope_freq = nullptr;
  int rope_dim = 0;
};

// Entry j is visible to the query at position p when j < (p + 1) / ratio.
// Columns at or past the last visible entry are left unwritten or -inf.
// nh <= 64, hd <= 128, hd % 8 == 0 (and rope_dim % 4 == 0, <= hd, with rope_freq).
Status indexer_scores(const IndexerScoreArgs& a, cudaStream_t stream);

struct TopkArgs {
  const StepInfo* step = nullptr;  // device: the chunk's pos0 and T
  const float* scores = nullptr;   // [T, ld] (only the first n_vis(t) of each row are read)
  int64_t ld = 0;                  // = capacity: n_vis(t) is clamped to it
  int64_t T = 0;                   // queries the launch is sized for (>= step->T)
  int ratio = 0, k = 0;
  int32_t* sel = nullptr;          // out [T, k] chosen ids, in increasing id order
  int32_t* count = nullptr;        // out [T] = min(k, n_vis(t))
  // Non-null: a one-query launch (T == 1) takes the decode form (topk_grid).
  // [kTopkScratchWords] device, zero before the first launch; each launch
  // leaves it zero again. One launch at a time.
  uint32_t* scratch = nullptr;
  // With scratch: the most entries visible in any step this launch serves
  // (a captured step replays over a range of positions); 0: ld.
  int64_t bound = 0;
};

constexpr int64_t kTopkScratchWords = 1288;

// Rows of up to this many entries are selected by one block: below it the
// grid's barriers and extra blocks cost more than its split saves.
constexpr int64_t kTopkOneBlockEntries = 4096;

// The decode form of a top-k over rows of at most `bound` entries: blocks ==
// 0 when it does not apply (T != 1), else `blocks` blocks of `threads`, each
// staging up to `chunk` entries. It depends only on the bound, so a captured
// step keeps its grid.
struct TopkGrid {
  int blocks = 0, threads = 0;
  int64_t chunk = 0;
};
TopkGrid topk_grid(int64_t bound, int64_t T, int multiprocessors);

// The k highest scores among the visible entries (ties: lower id first), or
// all visible entries when there are at most k. Radix select on the ordered
// bit pattern, then an ordered compaction: deterministic, O(n) per query.
Status indexer_topk(const TopkArgs& a, cudaStream_t stream);

}  // namespace aff::cuda
