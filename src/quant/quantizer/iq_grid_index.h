// Search tables over the i-quant codebooks (the grids in quant/ggml_grids.h, the one home
// of their values). Encoding a group of values means finding the codebook entry nearest
// to it, but a codebook holds only a small part of its lattice (IQ2_XXS: 256 of the
// 3^8 = 6561 points, IQ1_S: 2048 of 6561), so rounding each coordinate to its nearest
// level usually lands off the codebook. The index maps every lattice point ("key") to
// its codebook entry, or, for points off the codebook, to the entries nearest to it; the
// encoder then picks among those the one with the least weighted error.
//
// Tables are built on first use (thread-safe static initialisation) from the grids alone,
// so they are identical on every run and every machine.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace aff::quant {

enum class IqGrid {
  kIq2xxs,  // 256 entries x 8 magnitudes in {8, 25, 43}
  kIq2xs,   // 512 entries x 8 magnitudes in {8, 25, 43}
  kIq3xxs,  // 256 entries x 4 magnitudes in {4, 12, ..., 52, 62}
  kIq1s,    // 2048 entries x 8 ternary values in {-1, 0, 1} (IQ1_S and IQ1_M)
};

class IqGridIndex {
 public:
  static constexpr int kMaxLevels = 8;
  static constexpr int kMaxDims = 8;

  int dims() const { return dims_; }            // values per entry: 8, or 4 for IQ3_XXS
  int n_levels() const { return n_levels_; }    // distinct values per coordinate
  int n_entries() const { return n_entries_; }
  float level(int l) const { return levels_[l]; }  // ascending, l in [0, n_levels)
  float top_level() const { return levels_[n_levels_ - 1]; }

  // Entry e's coordinates as stored in the grid (e.g. 8, 25, 43): [dims].
  const float* entry(int e) const { return values_.data() + size_t(e) * size_t(dims_); }

  // Lattice point nearest to t[dims], coordinate by coordinate: the key's digit j (base
  // n_levels, least significant first) is coordinate j's level index, which is the number
  // of cuts below t[j] (cuts ascend). Counted without branches, four coordinates at a time
  // with SSE2: the encoder asks this for every group at every trial scale, and a
  // level-by-level walk mispredicts on nearly every coordinate.
  int key_of(const float* t) const {
#if defined(__SSE2__)
    __m128i key = _mm_setzero_si128();
    for (int h = 0; h < dims_; h += 4) {  // dims is 8 or 4
      const __m128 v = _mm_loadu_ps(t + h);
      const __m128i weight = _mm_loadu_si128(reinterpret_cast<const __m128i*>(digit_weight_ + h));
      for (int c = 0; c + 1 < n_levels_; ++c) {
        const __m128i above = _mm_castps_si128(_mm_cmpgt_ps(v, _mm_set1_ps(cuts_[c])));
        key = _mm_add_epi32(key, _mm_and_si128(above, weight));
      }
    }
    key = _mm_add_epi32(key, _mm_shuffle_epi32(key, 0x4e));  // lanes + lanes 2 apart
    key = _mm_add_epi32(key, _mm_shuffle_epi32(key, 0xb1));  // + the neighbour lane
    return _mm_cvtsi128_si32(key);
#else
    int key = 0;
    for (int j = 0; j < dims_; ++j) {
      for (int c = 0; c + 1 < n_levels_; ++c) key += t[j] > cuts_[c] ? digit_weight_[j] : 0;
    }
    return key;
#endif
  }

  // The codebook entry at lattice point `key`, or -1 when the codebook lacks that point.
  int entry_at(int key) const { return entry_at_key_[size_t(key)]; }

  // Entries nearest (unweighted Euclidean) to the off-codebook point `key`, nearest
  // first; ties at the cut-off distance are all included. Empty for points on the grid.
  std::span<const uint16_t> neighbours(int key) const {
    return {neighbours_.data() + neighbour_begin_[size_t(key)],
            neighbours_.data() + neighbour_begin_[size_t(key) + 1]};
  }

  // Built once per grid on first call; safe to call from any thread.
  static const IqGridIndex& get(IqGrid grid);

 private:
  IqGridIndex(IqGrid grid);

  int dims_ = 0;
  int n_levels_ = 0;
  int n_entries_ = 0;
  float levels_[kMaxLevels] = {};     // ascending coordinate values
  float cuts_[kMaxLevels - 1] = {};   // midpoints between consecutive levels
  int32_t digit_weight_[kMaxDims] = {};  // n_levels^j: the key's place value of coordinate j
  std::vector<float> values_;         // [n_entries][dims]
  std::vector<int32_t> entry_at_key_;        // [n_levels^dims]
  std::vector<uint32_t> neighbour_begin_;    // [n_levels^dims + 1] offsets into neighbours_
  std::vector<uint16_t> neighbours_;
};

}  // namespace aff::quant
