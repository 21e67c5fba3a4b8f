// Scalar helpers shared by the ISA kernels: block scale decodes and lookup tables.
// Header-only and `static` on purpose: each ISA translation unit gets its own copy
// compiled for its own target, so no AVX-512 code can leak into another TU by way of
// an inline function the linker de-duplicates.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

#include "core/dtype.h"
#include "quant/blocks.h"
#include "quant/ggml_grids.h"

namespace aff::cpu::isa {
namespace {

// All eight Q4_K scales and mins at once, one byte each (sub-block j in byte j): the
// 12 packed bytes read as three little-endian words, so four sub-blocks decode per op.
[[maybe_unused]] inline void q4k_unpack_scales(const uint8_t* s, uint64_t* sc, uint64_t* m) {
  uint32_t u0, u1, u2;
  std::memcpy(&u0, s, 4);
  std::memcpy(&u1, s + 4, 4);
  std::memcpy(&u2, s + 8, 4);
  const uint32_t sc_lo = u0 & 0x3f3f3f3fu, m_lo = u1 & 0x3f3f3f3fu;
  const uint32_t sc_hi = (u2 & 0x0f0f0f0fu) | (((u0 >> 6) & 0x03030303u) << 4);
  const uint32_t m_hi = ((u2 >> 4) & 0x0f0f0f0fu) | (((u1 >> 6) & 0x03030303u) << 4);
  *sc = uint64_t(sc_lo) | (uint64_t(sc_hi) << 32);
  *m = uint64_t(m_lo) | (uint64_t(m_hi) << 32);
}

// Q3_K's sixteen 6-bit scales, still stored +32, one byte each (sub-block i in byte i of
// the 16 bytes w[0..3]): low nibbles of bytes 0-7 are scales 0-7, their high nibbles
// 8-15, and byte 8 + i%4 holds the two high bits of scale i at shift 2*(i/4). Word ops
// decode four at a time; callers subtract 32 per byte in a vector register.
[[maybe_unused]] inline void q3k_scale_words(const uint8_t* s, uint32_t w[4]) {
  uint32_t a0, a1, a2;
  std::memcpy(&a0, s, 4);
  std::memcpy(&a1, s + 4, 4);
  std::memcpy(&a2, s + 8, 4);
  const uint32_t m4 = 0x0f0f0f0fu, m2 = 0x03030303u;
  w[0] = (a0 & m4) | ((a2 & m2) << 4);
  w[1] = (a1 & m4) | (((a2 >> 2) & m2) << 4);
  w[2] = ((a0 >> 4) & m4) | (((a2 >> 4) & m2) << 4);
  w[3] = ((a1 >> 4) & m4) | (((a2 >> 6) & m2) << 4);
}

// IQ4_XS 6-bit scale of sub-block ib (stored +32) minus 32.
[[maybe_unused]] inline int iq4xs_scale(const uint8_t* scales_l, uint16_t scales_h, int ib) {
  return int(((scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0f) | (((scales_h >> (2 * ib)) & 3) << 4)) - 32;
}

// ggml's MXFP4 "half" E8M0 decode, 2^(e-128), as a table. The tables here are constexpr:
// a static constructor would be compiled for each including TU's target (AVX-512 in
// gemv_avx512.cpp) and would run at start-up on every CPU, before any dispatch.
struct Mxfp4Scales {
  float v[256] = {};
  constexpr Mxfp4Scales() {
    for (int e = 0; e < 256; ++e) {
      const uint32_t bits = e < 2 ? (0x00200000u << e) : (uint32_t(e - 1) << 23);
      v[e] = std::bit_cast<float>(bits);
    }
  }
};
[[maybe_unused]] constexpr Mxfp4Scales kMxfp4Scales{};

// IQ2 sign index (7 bits, even parity implied) -> 8 bytes of +1/-1.
struct Iq2SignBytes {
  uint64_t v[128] = {};
  constexpr Iq2SignBytes() {
    for (int i = 0; i < 128; ++i) {
      uint64_t x = 0;
      for (int j = 0; j < 8; ++j) {
        const uint64_t b = (quant::kSignsIq2xs[i] >> j) & 1 ? 0xffu : 0x01u;
        x |= b << (8 * j);
      }
      v[i] = x;
    }
  }
};
[[maybe_unused]] constexpr Iq2SignBytes kIq2SignBytes{};

[[maybe_unused]] inline uint32_t load_u32(const void* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

}  // namespace
}  // namespace aff::cpu::isa
