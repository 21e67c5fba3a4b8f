// Shared helpers of the quality tests: a random V4 model with an MTP block and
// log-softmax arithmetic done independently of the code under test.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "../model/random_model.h"

namespace aff::quality_test {

// Sliding, CSA, HCA layers, 2 hash layers, and one sliding MTP block; the
// window (16) is far shorter than the test sequences, so every ring wraps.
inline dsv4::ModelConfig mtp_config() {
  dsv4::ModelConfig c = dsv4::testing::tiny_config({0, 4, 8, 0}, 2);
  c.compress_ratios.push_back(0);  // the MTP block
  c.num_mtp_layers = 1;
  return c;
}

// -log softmax(row)[target] in double. row: [vocab].
inline double nll_of(std::span<const float> row, int32_t target) {
  double m = -INFINITY;
  for (float v : row) m = std::max(m, double(v));
  double s = 0.0;
  for (float v : row) s += std::exp(double(v) - m);
  return m + std::log(s) - double(row[size_t(target)]);
}

inline int32_t argmax_of(std::span<const float> row) {
  int32_t best = 0;
  for (size_t i = 1; i < row.size(); ++i)
    if (row[i] > row[size_t(best)]) best = int32_t(i);
  return best;
}

inline std::vector<int32_t> random_tokens(std::mt19937_64& rng, int64_t n, int64_t vocab) {
  std::uniform_int_distribution<int32_t> d(0, int32_t(vocab - 1));
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = d(rng);
  return t;
}

}  // namespace aff::quality_test
