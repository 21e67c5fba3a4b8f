// Shared by the GPU tests: skip (with a message) when no CUDA device is
// visible, so a CUDA build on a GPU-less CI machine stays green.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "backend/device_probe.h"

namespace aff::cuda::testing {

inline bool gpu_present(std::string* why) {
  static std::string error;
  static const bool present = !aff::probe_gpus(&error).empty();
  if (why) *why = error.empty() ? "no device listed" : error;
  return present;
}

// A test's random seed: AFF_TEST_SEED when set (to replay a failure, whose
// message carries the seed), else a fresh one per run.
inline uint64_t test_seed() {
  if (const char* s = std::getenv("AFF_TEST_SEED"); s != nullptr && *s != '\0') return std::strtoull(s, nullptr, 10);
  return std::random_device{}();
}

// n values drawn from N(0, sd^2).
inline std::vector<float> randn(size_t n, std::mt19937_64& rng, float sd = 1.0f) {
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

// n values drawn uniformly from [lo, hi).
inline std::vector<float> uniform(size_t n, std::mt19937_64& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

}  // namespace aff::cuda::testing

// Declares `seed` (test_seed()) and `rng` (a 64-bit Mersenne Twister from it)
// and names the seed in every failure of the enclosing scope.
#define AFF_SEEDED_RNG(seed, rng)                                \
  const uint64_t seed = ::aff::cuda::testing::test_seed();       \
  SCOPED_TRACE("seed " + std::to_string(seed));                  \
  std::mt19937_64 rng(seed)

#define AFF_SKIP_WITHOUT_GPU()                                                                   \
  do {                                                                                           \
    std::string why_;                                                                            \
    if (!::aff::cuda::testing::gpu_present(&why_))                                               \
      GTEST_SKIP() << "no CUDA device visible (" << why_ << "): GPU tests skipped on this machine"; \
  } while (0)
