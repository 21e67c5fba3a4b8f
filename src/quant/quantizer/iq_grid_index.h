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
  // n_levels, least significant first) is coordinate j's level index.
  int key_of(const float* t) const {
    int key = 0;
    for (int j = dims_ - 1; j >= 0; --j) {
      int l = 0;
      while (l + 1 < n_levels_ && t[j] > cuts_[l]) ++l;
      key = key * n_levels_ + l;
    }
    return key;
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
  std::vector<float> values_;         // [n_entries][dims]
  std::vector<int32_t> entry_at_key_;        // [n_levels^dims]
  std::vector<uint32_t> neighbour_begin_;    // [n_levels^dims + 1] offsets into neighbours_
  std::vector<uint16_t> neighbours_;
};

}  // namespace aff::quant
