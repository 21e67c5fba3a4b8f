// The CPU side of the GEMV tests on ggml-stored weights: the product with W
// decoded by the CPU reference, in f64, and the error measure judged against
// each dot's natural size.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/ref/linear.h"
#include "model/dsv4/weights.h"

namespace aff::cuda::testing {

// y [T, w.out] with y[t, r] = sum_i W[r, i] x[t, i] (x: [T, w.in]);
// size[t, r] = sqrt(sum_i (W[r, i] x[t, i])^2), the scale an error is judged by:
// a row whose terms happen to cancel would make an error relative to the result
// arbitrarily large.
inline std::vector<float> host_product(const dsv4::Linear& w, const std::vector<float>& x, int64_t T,
                                       std::vector<double>& size) {
  std::vector<float> row(static_cast<size_t>(w.in)), y(static_cast<size_t>(T * w.out));
  size.assign(y.size(), 0.0);
  for (int64_t r = 0; r < w.out; ++r) {
    ref::linear_dequant_row(w, r, row.data());
    for (int64_t t = 0; t < T; ++t) {
      double s = 0.0, q = 0.0;
      for (int64_t i = 0; i < w.in; ++i) {
        const double p = double(row[size_t(i)]) * double(x[size_t(t * w.in + i)]);
        s += p, q += p * p;
      }
      y[size_t(t * w.out + r)] = float(s);
      size[size_t(t * w.out + r)] = std::sqrt(q);
    }
  }
  return y;
}

// sqrt(sum err^2 / sum size^2) over size.size() outputs.
inline double rel_to_size(const float* got, const float* want, const std::vector<double>& size) {
  double e = 0.0, n = 0.0;
  for (size_t i = 0; i < size.size(); ++i) {
    e += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    n += size[i] * size[i];
  }
  return std::sqrt(e / std::max(n, 1e-300));
}
inline double rel_to_size(const std::vector<float>& got, const std::vector<float>& want,
                          const std::vector<double>& size) {
  return rel_to_size(got.data(), want.data(), size);
}

}  // namespace aff::cuda::testing
