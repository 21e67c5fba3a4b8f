#include "backend/ref/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace aff::ref {

std::vector<float> rope_inv_freq(double theta, int rope_dim, const YarnParams* yarn) {
  const int half = rope_dim / 2;
  // theta^(2i/d) in f32, as the transformers implementation evaluates it.
  std::vector<float> pos_freq(static_cast<size_t>(half)), inv(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) {
    pos_freq[size_t(i)] = std::pow(float(theta), float(2 * i) / float(rope_dim));
    inv[size_t(i)] = 1.0f / pos_freq[size_t(i)];
  }
  if (!yarn) return inv;

  const double d = rope_dim, orig = double(yarn->original_max_position);
  auto corr = [&](double rotations) {
    return d * std::log(orig / (rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(theta));
  };
  double lo = std::max(std::floor(corr(yarn->beta_fast)), 0.0);
  double hi = std::min(std::ceil(corr(yarn->beta_slow)), d - 1.0);
  if (lo == hi) hi += 0.001;  // avoid a zero-width ramp
  const float factor = float(yarn->factor);
  for (int i = 0; i < half; ++i) {
    const float ramp = std::clamp(float((double(i) - lo) / (hi - lo)), 0.0f, 1.0f);
    const float keep = 1.0f - ramp;  // share of the unscaled frequency
    const float scaled = 1.0f / (factor * pos_freq[size_t(i)]);
    inv[size_t(i)] = scaled * (1.0f - keep) + inv[size_t(i)] * keep;
  }
  return inv;
}

void rope_apply(float* v, const std::vector<float>& inv_freq, int64_t pos, bool inverse) {
  const float p = float(pos);
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const float angle = p * inv_freq[i];
    const float c = std::cos(angle);
    const float s = inverse ? -std::sin(angle) : std::sin(angle);
    const float a = v[2 * i], b = v[2 * i + 1];
    v[2 * i] = a * c - b * s;
    v[2 * i + 1] = b * c + a * s;
  }
}

}  // namespace aff::ref
