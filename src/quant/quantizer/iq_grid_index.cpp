#include "quant/quantizer/iq_grid_index.h"

#include <algorithm>

#include "core/check.h"
#include "quant/ggml_grids.h"

namespace aff::quant {
namespace {

// How many nearest entries an off-codebook point keeps (more when tied at the cut-off).
// The encoder weighs each of them against the actual values, so a longer list finds
// better entries for unevenly weighted groups at a linear cost in encode time; past these
// counts the relative error on Gaussian rows stopped improving by more than 0.1%.
constexpr int kNeighboursIq2 = 8;
constexpr int kNeighboursIq3 = 8;
constexpr int kNeighboursIq1 = 8;

// Stored coordinates of every entry: [n_entries][dims] as signed integers.
std::vector<int> grid_coordinates(IqGrid grid, int* dims) {
  std::vector<int> out;
  auto unpack = [&](const auto& table, int d, bool is_signed) {
    *dims = d;
    for (const auto word : table) {
      for (int j = 0; j < d; ++j) {
        const auto byte = uint8_t(uint64_t(word) >> (8 * j));
        out.push_back(is_signed ? int(int8_t(byte)) : int(byte));
      }
    }
  };
  switch (grid) {
    case IqGrid::kIq2xxs: unpack(kIq2xxsGrid, 8, false); break;
    case IqGrid::kIq2xs: unpack(kIq2xsGrid, 8, false); break;
    case IqGrid::kIq3xxs: unpack(kIq3xxsGrid, 4, false); break;
    case IqGrid::kIq1s: unpack(kIq1sGrid, 8, true); break;
  }
  return out;
}

int neighbour_count(IqGrid grid) {
  switch (grid) {
    case IqGrid::kIq2xxs:
    case IqGrid::kIq2xs: return kNeighboursIq2;
    case IqGrid::kIq3xxs: return kNeighboursIq3;
    case IqGrid::kIq1s: return kNeighboursIq1;
  }
  return kNeighboursIq2;
}

}  // namespace

IqGridIndex::IqGridIndex(IqGrid grid) {
  const std::vector<int> coords = grid_coordinates(grid, &dims_);
  n_entries_ = int(coords.size()) / dims_;

  std::vector<int> distinct = coords;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  AFF_CHECK(distinct.size() >= 2 && distinct.size() <= size_t(kMaxLevels));
  n_levels_ = int(distinct.size());
  for (int l = 0; l < n_levels_; ++l) levels_[l] = float(distinct[size_t(l)]);
  for (int l = 0; l + 1 < n_levels_; ++l) cuts_[l] = 0.5f * (levels_[l] + levels_[l + 1]);
  AFF_CHECK(dims_ == 8 || dims_ == 4);  // key_of reads coordinates four at a time
  for (int j = 0, weight = 1; j < dims_; ++j, weight *= n_levels_) digit_weight_[j] = weight;

  values_.assign(coords.begin(), coords.end());
  auto level_index = [&](int v) {
    return int(std::lower_bound(distinct.begin(), distinct.end(), v) - distinct.begin());
  };

  int n_keys = 1;
  for (int j = 0; j < dims_; ++j) n_keys *= n_levels_;
  entry_at_key_.assign(size_t(n_keys), -1);
  for (int e = 0; e < n_entries_; ++e) {
    int key = 0;
    for (int j = dims_ - 1; j >= 0; --j) key = key * n_levels_ + level_index(coords[size_t(e * dims_ + j)]);
    AFF_CHECK(entry_at_key_[size_t(key)] < 0);  // a codebook lists each point once
    entry_at_key_[size_t(key)] = e;
  }

  // Nearest entries of each off-codebook point, by squared distance in stored units
  // (the units the decoder multiplies).
  const int want = std::min(neighbour_count(grid), n_entries_);
  neighbour_begin_.assign(size_t(n_keys) + 1, 0);
  std::vector<int> dist(static_cast<size_t>(n_entries_));  // squared distance of each entry
  std::vector<int> order(static_cast<size_t>(n_entries_));
  float point[kMaxDims];
  for (int key = 0; key < n_keys; ++key) {
    neighbour_begin_[size_t(key)] = uint32_t(neighbours_.size());
    if (entry_at_key_[size_t(key)] >= 0) continue;
    for (int j = 0, k = key; j < dims_; ++j, k /= n_levels_) point[j] = levels_[k % n_levels_];
    for (int e = 0; e < n_entries_; ++e) {
      int d2 = 0;
      for (int j = 0; j < dims_; ++j) {
        const int diff = int(point[j]) - coords[size_t(e * dims_ + j)];
        d2 += diff * diff;
      }
      dist[size_t(e)] = d2;
      order[size_t(e)] = e;
    }
    // Nearest first, then by index: the encoder keeps the first of equally good
    // candidates, so the order must not depend on the sort's whims.
    const auto closer = [&](int a, int b) {
      return dist[size_t(a)] < dist[size_t(b)] || (dist[size_t(a)] == dist[size_t(b)] && a < b);
    };
    std::nth_element(order.begin(), order.begin() + (want - 1), order.end(), closer);
    const int cutoff = dist[size_t(order[size_t(want - 1)])];
    const size_t first = neighbours_.size();
    for (int e = 0; e < n_entries_; ++e) {
      if (dist[size_t(e)] <= cutoff) neighbours_.push_back(uint16_t(e));
    }
    std::sort(neighbours_.begin() + std::ptrdiff_t(first), neighbours_.end(), closer);
  }
  neighbour_begin_[size_t(n_keys)] = uint32_t(neighbours_.size());
}

const IqGridIndex& IqGridIndex::get(IqGrid grid) {
  // Function-local statics: built once, on first use, under the compiler's init guard.
  switch (grid) {
    case IqGrid::kIq2xxs: {
      static const IqGridIndex index(IqGrid::kIq2xxs);
      return index;
    }
    case IqGrid::kIq2xs: {
      static const IqGridIndex index(IqGrid::kIq2xs);
      return index;
    }
    case IqGrid::kIq3xxs: {
      static const IqGridIndex index(IqGrid::kIq3xxs);
      return index;
    }
    case IqGrid::kIq1s: break;
  }
  static const IqGridIndex index(IqGrid::kIq1s);
  return index;
}

}  // namespace aff::quant
