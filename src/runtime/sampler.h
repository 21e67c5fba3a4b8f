// Sampling internals behind aff::Sampler (include/affinity/engine.h), exposed
// so tests can check the filtered distribution itself, not only draws from it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "affinity/engine.h"

namespace aff::runtime {

struct Candidate {
  int32_t id = 0;
  float prob = 0.0f;  // renormalised over the surviving candidates
};

// The distribution a non-greedy Sampler draws from: softmax(logits / T), then
// top-k, top-p and min-p filtering, renormalised. Sorted by descending
// probability (ties: lower id first). Never empty for a non-empty, non-NaN row.
// logits: [vocab]; params.temperature must be > 0.
std::vector<Candidate> sampling_distribution(std::span<const float> logits, const SamplingParams& params);

// Index of the largest logit, lowest index on ties; -1 for an empty row.
int32_t argmax(std::span<const float> logits);

// The k largest logits as (id, logit), descending (ties: lower id first).
std::vector<std::pair<int32_t, float>> top_logits(std::span<const float> logits, int k);

// xoshiro256** seeded through splitmix64: deterministic on every platform,
// unlike std::uniform_real_distribution.
void rng_seed(uint64_t state[4], uint64_t seed);
uint64_t rng_next(uint64_t state[4]);
double rng_uniform(uint64_t state[4]);  // [0, 1), 53 random bits

}  // namespace aff::runtime
