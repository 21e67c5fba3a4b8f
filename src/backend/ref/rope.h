// Rotary position embedding as DeepSeek-V4 uses it: interleaved pairs
// (x[2i], x[2i+1]) on the trailing rope_dim dims of a vector, plain theta or
// YaRN-scaled frequencies, and never YaRN's attention-temperature (mscale).
#pragma once

#include <cstdint>
#include <vector>

namespace aff::ref {

struct YarnParams {
  double factor = 1.0;                 // frequency division for the slow pairs (16)
  int64_t original_max_position = 0;   // original context the ramp is computed for (65536)
  double beta_fast = 32.0;             // rotations bounding the untouched (fast) pairs
  double beta_slow = 1.0;              // rotations bounding the fully scaled (slow) pairs
};

// Inverse frequencies, one per pair: [rope_dim / 2], f32.
// Plain: f_i = 1 / theta^(2i/rope_dim). YaRN (when yarn != nullptr): pairs below
// the correction range keep f_i, pairs above it get f_i / factor, and the pairs
// in between blend linearly (ramp from floor(corr(beta_fast)) to
// ceil(corr(beta_slow)), corr(n) = d*ln(orig/(2*pi*n)) / (2*ln theta)).
std::vector<float> rope_inv_freq(double theta, int rope_dim, const YarnParams* yarn);

// Rotates the pairs of v: [2 * inv_freq.size()] (the rope tail of one vector)
// by angle f32(pos) * inv_freq[i]; inverse = true rotates by the negative angle.
void rope_apply(float* v, const std::vector<float>& inv_freq, int64_t pos, bool inverse);

}  // namespace aff::ref
