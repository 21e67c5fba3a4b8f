// Where the current chunk sits in the sequence, kept in device memory so that
// a decode step can be captured once as a CUDA graph and replayed for every
// token: kernels whose work depends on the position (RoPE angles, ring slots,
// how many compressed entries are visible, which entries a chunk completes)
// read it from here instead of from their launch arguments. Grids are sized
// for the largest case and the surplus blocks exit early.
//
// The helpers are __host__ __device__ so that the host (sizing, validation)
// and the kernels derive every count from the same formulas.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define AFF_HD __host__ __device__ inline
#else
#define AFF_HD inline
#endif

namespace aff::cuda {

struct StepInfo {
  int64_t pos0 = 0;  // position of the chunk's first token (= n_past before the chunk)
  int64_t T = 0;     // tokens in the chunk
};

// Compressed entries complete after positions [0, end): entry j covers
// positions [j*ratio, (j+1)*ratio).
AFF_HD int64_t entries_done(int64_t end, int ratio) { return end / ratio; }

// Entries a chunk [pos0, pos0 + T) completes: ids [first, first + count).
AFF_HD int64_t first_new_entry(const StepInfo& s, int ratio) { return s.pos0 / ratio; }
AFF_HD int64_t new_entries(const StepInfo& s, int ratio) {
  return (s.pos0 + s.T) / ratio - s.pos0 / ratio;
}

// Entries visible to the query at position p (those wholly at or before p).
AFF_HD int64_t visible_entries(int64_t p, int ratio) { return (p + 1) / ratio; }

// The same, of a cache holding at most `capacity` entries.
AFF_HD int64_t visible_entries(int64_t p, int ratio, int64_t capacity) {
  const int64_t v = visible_entries(p, ratio);
  return v < capacity ? v : capacity;
}

}  // namespace aff::cuda

#undef AFF_HD
