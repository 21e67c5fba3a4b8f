// Element types that appear in checkpoints and containers, and the scalar
// conversions between them. This is the single home of these bit layouts.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace aff {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kF8E4M3,  // OCP E4M3FN: no inf, 0x7F/0xFF are NaN
  kF8E8M0,  // unsigned power-of-two scale: byte e means 2^(e-127)
  kI8,      // in V4 checkpoints: packed FP4 E2M1, two codes per byte (low nibble = even element)
  kU8,
  kI32,
  kI64,
  kBool,
};

// Size in bytes of one stored element.
int dtype_size(DType t);
std::string_view dtype_name(DType t);  // safetensors spelling: "F32", "BF16", "F8_E4M3", ...
std::optional<DType> dtype_from_safetensors(std::string_view name);

inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t bits_from_f32(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bf16_to_f32(uint16_t h) { return f32_from_bits(uint32_t(h) << 16); }

// Round-to-nearest-even, NaN kept quiet.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = bits_from_f32(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);  // RNE

// E4M3FN decode via a 256-entry table (NaN codes decode to NaN).
extern const float kE4M3ToF32[256];
inline float e4m3_to_f32(uint8_t b) { return kE4M3ToF32[b]; }
// RNE encode of a value; |x| > 448 saturates to ±448 (the official cast clamps first).
uint8_t f32_to_e4m3(float f);

// E8M0: 2^(e-127); byte 0 gives 2^-127 (denormal 0x00400000), 255 is NaN.
inline float e8m0_to_f32(uint8_t e) {
  if (e == 0) return f32_from_bits(0x00400000u);
  if (e == 255) return std::nanf("");
  return f32_from_bits(uint32_t(e) << 23);
}

// FP4 E2M1 code (low 4 bits) to value.
inline constexpr float kE2M1ToF32[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                         -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
// RNE encode onto the E2M1 grid, |x| clamped to 6.
uint8_t f32_to_e2m1(float f);

}  // namespace aff
