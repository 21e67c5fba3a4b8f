#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace aff::runtime {

namespace {

uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

// Descending value, ascending id: a total order, so results never depend on
// the sort algorithm's handling of ties.
template <typename T>
bool before(int32_t ia, T a, int32_t ib, T b) {
  return a > b || (a == b && ia < ib);
}

}  // namespace

void rng_seed(uint64_t state[4], uint64_t seed) {
  uint64_t z = seed;
  for (int i = 0; i < 4; ++i) {
    z += 0x9e3779b97f4a7c15ull;
    uint64_t x = z;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    state[i] = x ^ (x >> 31);
  }
}

uint64_t rng_next(uint64_t s[4]) {
  const uint64_t result = rotl(s[1] * 5, 7) * 9;
  const uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

double rng_uniform(uint64_t s[4]) { return double(rng_next(s) >> 11) * 0x1.0p-53; }

int32_t argmax(std::span<const float> logits) {
  int32_t best = -1;
  for (size_t i = 0; i < logits.size(); ++i) {
    // NaN never wins: a comparison with NaN is false.
    if (best < 0 || logits[i] > logits[size_t(best)]) best = int32_t(i);
  }
  return best;
}

std::vector<std::pair<int32_t, float>> top_logits(std::span<const float> logits, int k) {
  std::vector<std::pair<int32_t, float>> all(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) all[i] = {int32_t(i), logits[i]};
  const size_t n = std::min(all.size(), size_t(std::max(k, 0)));
  auto cmp = [](const auto& a, const auto& b) { return before(a.first, a.second, b.first, b.second); };
  std::partial_sort(all.begin(), all.begin() + ptrdiff_t(n), all.end(), cmp);
  all.resize(n);
  return all;
}

std::vector<Candidate> sampling_distribution(std::span<const float> logits, const SamplingParams& p) {
  std::vector<Candidate> c;
  if (logits.empty()) return c;
  const double inv_t = 1.0 / double(p.temperature);

  // Top-k on logits (temperature does not change the order).
  std::vector<std::pair<int32_t, float>> kept;
  if (p.top_k > 0 && size_t(p.top_k) < logits.size()) {
    kept = top_logits(logits, p.top_k);
  } else {
    kept = top_logits(logits, int(logits.size()));
  }

  // Softmax in double over the survivors; kept[0] holds the maximum.
  const double max_logit = kept[0].second;
  std::vector<double> w(kept.size());
  double sum = 0.0;
  for (size_t i = 0; i < kept.size(); ++i) {
    w[i] = std::exp((double(kept[i].second) - max_logit) * inv_t);
    sum += w[i];
  }
  for (double& x : w) x /= sum;

  // Top-p: the shortest prefix whose mass reaches top_p (at least one token).
  size_t n = kept.size();
  if (p.top_p < 1.0f) {
    double cum = 0.0;
    for (size_t i = 0; i < kept.size(); ++i) {
      cum += w[i];
      if (cum >= double(p.top_p)) {
        n = i + 1;
        break;
      }
    }
  }
  // Min-p: relative to the most likely token, which survives every filter, so
  // the ratio is the same before or after renormalisation.
  if (p.min_p > 0.0f) {
    const double floor = double(p.min_p) * w[0];
    size_t m = 1;
    while (m < n && w[m] >= floor) ++m;
    n = m;
  }

  double mass = 0.0;
  for (size_t i = 0; i < n; ++i) mass += w[i];
  c.resize(n);
  for (size_t i = 0; i < n; ++i) c[i] = {kept[i].first, float(w[i] / mass)};
  return c;
}

}  // namespace aff::runtime

namespace aff {

Sampler::Sampler(const SamplingParams& params) : params_(params) {
  runtime::rng_seed(rng_, params.seed);
}

int32_t Sampler::sample(std::span<const float> logits) {
  if (params_.temperature <= 0.0f) return runtime::argmax(logits);
  const std::vector<runtime::Candidate> dist = runtime::sampling_distribution(logits, params_);
  if (dist.empty()) return -1;
  // Inverse CDF; the last candidate absorbs float rounding of the total.
  const double u = runtime::rng_uniform(rng_);
  double cum = 0.0;
  for (size_t i = 0; i + 1 < dist.size(); ++i) {
    cum += double(dist[i].prob);
    if (u < cum) return dist[i].id;
  }
  return dist.back().id;
}

}  // namespace aff
