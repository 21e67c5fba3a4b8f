// Activation vectors quantised to int8 for the integer dot products of the CPU lane.
// Two shapes, after ggml's Q8_0 and Q8_K but with an f32 scale (the activation is
// quantised once per GEMV and read by every row, so a wider scale costs nothing):
//   ActQ8_0: per 32 inputs, pairs with weights in 32-element blocks (Q8_0, MXFP4);
//   ActQ8K:  per 256 inputs plus 16-wide partial sums, pairs with the 256-element
//            super-blocks (Q4_K, Q2_K, IQ2_XXS); the partial sums fold the K-quant mins.
//   ActQ8K with transposed groups (kQ8KT): the same struct, but qs holds the 256 inputs
//            in codebook-row order: byte 64k + 8g + j is input 32g + 8k + j (group g of
//            32, row k of 8). A 64-byte step then holds one 8-input row of each of the
//            eight groups, so the IQ kernels apply the per-group scales once per
//            super-block instead of once per step. bsums stay in natural order.
// Quants are in [-127, 127] (never -128), which the SIMD sign tricks rely on.
#pragma once

#include <cstdint>
#include <span>

namespace aff::cpu {

struct ActQ8_0 {
  float d;         // x[j] ≈ d * qs[j]
  int8_t qs[32];
};
static_assert(sizeof(ActQ8_0) == 36);

struct ActQ8K {
  float d;            // x[j] ≈ d * qs[j]
  int8_t qs[256];
  int16_t bsums[16];  // bsums[i] = sum of qs[16 i .. 16 i + 15]
};
static_assert(sizeof(ActQ8K) == 292);

enum class ActFormat { kQ8_0, kQ8K, kQ8KT };

inline constexpr int64_t act_block_elems(ActFormat f) { return f == ActFormat::kQ8_0 ? 32 : 256; }
inline constexpr int64_t act_block_bytes(ActFormat f) {
  return f == ActFormat::kQ8_0 ? int64_t(sizeof(ActQ8_0)) : int64_t(sizeof(ActQ8K));
}
// Position in a kQ8KT block's qs of input i (0..255) of that block.
inline constexpr int act_q8kt_pos(int i) { return 64 * ((i % 32) / 8) + 8 * (i / 32) + i % 8; }
// Bytes of a quantised activation of n inputs (n a multiple of the block size).
inline constexpr int64_t act_bytes(ActFormat f, int64_t n) { return n / act_block_elems(f) * act_block_bytes(f); }

// x: [n] f32, n a multiple of act_block_elems(f). out: act_bytes(f, n) bytes.
// Round-to-nearest with d = max|x| / 127 per block.
void quantize_act(ActFormat f, std::span<const float> x, void* out);
// Inverse (for reference checks): out[n] = d * qs.
void dequantize_act(ActFormat f, const void* act, std::span<float> out);

}  // namespace aff::cpu
