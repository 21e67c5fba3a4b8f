#include "core/dtype.h"

#include <array>

namespace aff {

int dtype_size(DType t) {
  switch (t) {
    case DType::kF32: case DType::kI32: return 4;
    case DType::kF16: case DType::kBF16: return 2;
    case DType::kI64: return 8;
    case DType::kF8E4M3: case DType::kF8E8M0: case DType::kI8: case DType::kU8: case DType::kBool:
      return 1;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kF8E4M3: return "F8_E4M3";
    case DType::kF8E8M0: return "F8_E8M0";
    case DType::kI8: return "I8";
    case DType::kU8: return "U8";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
    case DType::kBool: return "BOOL";
  }
  return "?";
}

std::optional<DType> dtype_from_safetensors(std::string_view n) {
  if (n == "F32") return DType::kF32;
  if (n == "F16") return DType::kF16;
  if (n == "BF16") return DType::kBF16;
  if (n == "F8_E4M3") return DType::kF8E4M3;
  if (n == "F8_E8M0") return DType::kF8E8M0;
  if (n == "I8") return DType::kI8;
  if (n == "U8") return DType::kU8;
  if (n == "I32") return DType::kI32;
  if (n == "I64") return DType::kI64;
  if (n == "BOOL") return DType::kBool;
  return std::nullopt;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t man = h & 0x3ff;
  if (exp == 0) {
    // zero or subnormal: man * 2^-24
    float v = std::ldexp(float(man), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return f32_from_bits(sign | 0x7f800000u | (man << 13));
  return f32_from_bits(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t f32_to_f16(float f) {
  const uint32_t u = bits_from_f32(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00u;
  if (a >= 65520.0f) return sign | 0x7c00u;  // rounds to inf
  if (a < 6.103515625e-05f) {                // subnormal range: quantum 2^-24
    const float q = std::nearbyint(a * 16777216.0f);  // default FE_TONEAREST = RNE
    return sign | uint16_t(q);
  }
  uint32_t v = bits_from_f32(a);
  v += 0xfffu + ((v >> 13) & 1u);
  return sign | uint16_t(((v >> 13) - (112u << 10)) & 0x7fffu);
}

namespace {
std::array<float, 256> make_e4m3_table() {
  std::array<float, 256> t{};
  for (int b = 0; b < 256; ++b) {
    const int sign = b >> 7, exp = (b >> 3) & 0xf, man = b & 7;
    float v;
    if (exp == 15 && man == 7) v = std::nanf("");
    else if (exp == 0) v = std::ldexp(float(man), -9);  // subnormal: man/8 * 2^-6
    else v = std::ldexp(1.0f + float(man) / 8.0f, exp - 7);
    t[b] = sign ? -v : v;
  }
  return t;
}
const std::array<float, 256> kE4M3Table = make_e4m3_table();
}  // namespace

const float kE4M3ToF32[256] = {
#define AFF_E(i) kE4M3Table[i]
#define AFF_E8(i) AFF_E(i), AFF_E(i + 1), AFF_E(i + 2), AFF_E(i + 3), AFF_E(i + 4), AFF_E(i + 5), AFF_E(i + 6), AFF_E(i + 7)
#define AFF_E64(i) AFF_E8(i), AFF_E8(i + 8), AFF_E8(i + 16), AFF_E8(i + 24), AFF_E8(i + 32), AFF_E8(i + 40), AFF_E8(i + 48), AFF_E8(i + 56)
    AFF_E64(0), AFF_E64(64), AFF_E64(128), AFF_E64(192)
#undef AFF_E64
#undef AFF_E8
#undef AFF_E
};

// Encode by searching the positive grid: exact RNE between neighbours.
uint8_t f32_to_e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;
  // Positive codes 0..0x7e are monotonically increasing in value.
  int lo = 0, hi = 0x7e;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (kE4M3Table[mid] <= a) lo = mid; else hi = mid;
  }
  const float dl = a - kE4M3Table[lo], dh = kE4M3Table[hi] - a;
  int code;
  if (dl < dh) code = lo;
  else if (dh < dl) code = hi;
  else code = (lo & 1) ? hi : lo;  // tie: even mantissa
  return sign | uint8_t(code);
}

uint8_t f32_to_e2m1(float f) {
  static constexpr float kGrid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const uint8_t sign = std::signbit(f) ? 8 : 0;
  float a = std::fabs(f);
  if (std::isnan(a)) return sign | 7;
  if (a >= 6.0f) return sign | 7;
  int lo = 0;
  while (lo < 7 && kGrid[lo + 1] <= a) ++lo;
  if (lo == 7) return sign | 7;
  const float dl = a - kGrid[lo], dh = kGrid[lo + 1] - a;
  int code;
  if (dl < dh) code = lo;
  else if (dh < dl) code = lo + 1;
  else code = (lo & 1) ? lo + 1 : lo;  // tie: even code = even mantissa
  return sign | uint8_t(code);
}

}  // namespace aff
