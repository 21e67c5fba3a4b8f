// Super-block decoders for the codebook formats IQ2_XS, IQ3_XXS, IQ1_S and IQ1_M into
// signed int8 weights plus one small integer scale per 16 inputs, so that one SIMD dot
// loop serves all four:
//   weight i of the super-block = d * scale[i / 16] * q[i].
// Each format's deltas and half-steps are folded into integers: IQ2/IQ3 store
// d * (0.5 + s) / 4 as (2s + 1) with d / 8 (d / 4 for IQ3); IQ1's grid value g in
// {-1, 0, 1} shifted by ±1/8 becomes 8g ± 1 with d / 8. |q| <= 62 everywhere, so four
// products with |x| <= 127 stay below 2^15 (the vpmaddwd scale trick). The AVX2 kernels
// use it; AVX-512 gathers the same rows in vector registers (gemv_iqgather_avx512.cpp),
// reading the sign-mask and IQ1 row tables below.
// Header-only and `static` like kernel_common.h: each ISA translation unit compiles its
// own copy for its own target.
#pragma once

#include <cstdint>
#include <cstring>

#include "quant/blocks.h"
#include "quant/ggml_grids.h"

namespace aff::cpu::isa {
namespace {

struct DecodedIq {
  alignas(64) int8_t q[256];  // signed weights, natural order
  alignas(32) int16_t scale[16];  // per 16 inputs, >= 1
  float d;                        // super-block scale (f32)
};

// Rows are decoded eight bytes at a time in a 64-bit register (SWAR), from tables built
// at compile time (constexpr: no static initialiser runs code of this TU's ISA).
struct IqDecodeTables {
  uint64_t sign_mask[128] = {};    // 7-bit sign index -> 0xff in the bytes to negate
  uint64_t iq1_rows[2048][2] = {};  // IQ1 grid row as bytes 8g + 1 ([0]) and 8g - 1 ([1])
  constexpr IqDecodeTables() {
    for (int i = 0; i < 128; ++i) {
      for (int j = 0; j < 8; ++j) {
        if ((quant::kSignsIq2xs[i] >> j) & 1) sign_mask[i] |= uint64_t(0xff) << (8 * j);
      }
    }
    for (int i = 0; i < 2048; ++i) {
      for (int j = 0; j < 8; ++j) {
        const int g = int(int8_t(uint8_t(quant::kIq1sGrid[i] >> (8 * j))));
        iq1_rows[i][0] |= uint64_t(uint8_t(8 * g + 1)) << (8 * j);
        iq1_rows[i][1] |= uint64_t(uint8_t(8 * g - 1)) << (8 * j);
      }
    }
  }
};
constexpr IqDecodeTables kIqDecode{};

// 8 weights of grid row `grid` (8 magnitude bytes, all >= 1) with the 7-bit sign index:
// a negated byte is (m ^ 0xff) + 1 <= 0xff, so the add never carries into its neighbour.
[[maybe_unused]] inline void iq_emit8_signed(uint64_t grid, unsigned sign_index, int8_t* q) {
  const uint64_t m = kIqDecode.sign_mask[sign_index & 127];
  const uint64_t v = (grid ^ m) + (m & 0x0101010101010101ull);
  std::memcpy(q, &v, 8);
}

template <class F16>
[[maybe_unused]] inline void decode_iq2xs(const quant::BlockIq2Xs& b, F16 f16, DecodedIq& out) {
  out.d = f16(b.d) * 0.125f;
  for (int ib = 0; ib < 8; ++ib) {
    out.scale[2 * ib] = int16_t(2 * (b.scales[ib] & 0x0f) + 1);
    out.scale[2 * ib + 1] = int16_t(2 * (b.scales[ib] >> 4) + 1);
    for (int l = 0; l < 4; ++l) {
      const uint16_t v = b.qs[4 * ib + l];  // 9-bit grid index | 7-bit sign index << 9
      iq_emit8_signed(quant::kIq2xsGrid[v & 511], v >> 9, out.q + 32 * ib + 8 * l);
    }
  }
}

template <class F16>
[[maybe_unused]] inline void decode_iq3xxs(const quant::BlockIq3Xxs& b, F16 f16, DecodedIq& out) {
  out.d = f16(b.d) * 0.25f;
  for (int ib = 0; ib < 8; ++ib) {
    uint32_t ss;
    std::memcpy(&ss, b.qs + 64 + 4 * ib, 4);
    out.scale[2 * ib] = out.scale[2 * ib + 1] = int16_t(2 * (ss >> 28) + 1);
    for (int l = 0; l < 4; ++l) {
      const uint64_t grid = uint64_t(quant::kIq3xxsGrid[b.qs[8 * ib + 2 * l]]) |
                            (uint64_t(quant::kIq3xxsGrid[b.qs[8 * ib + 2 * l + 1]]) << 32);
      iq_emit8_signed(grid, (ss >> (7 * l)) & 127, out.q + 32 * ib + 8 * l);
    }
  }
}

// 8 weights 8*g + s for IQ1 grid row `idx` (values g in {-1, 0, 1}), s = ±1.
[[maybe_unused]] inline void iq1_emit8(unsigned idx, int s, int8_t* q) {
  std::memcpy(q, &kIqDecode.iq1_rows[idx][s < 0 ? 1 : 0], 8);
}

template <class F16>
[[maybe_unused]] inline void decode_iq1s(const quant::BlockIq1S& b, F16 f16, DecodedIq& out) {
  out.d = f16(b.d) * 0.125f;
  for (int ib = 0; ib < 8; ++ib) {
    const uint16_t qh = b.qh[ib];
    out.scale[2 * ib] = out.scale[2 * ib + 1] = int16_t(2 * ((qh >> 12) & 7) + 1);
    const int s = (qh & 0x8000) ? -1 : 1;
    for (int l = 0; l < 4; ++l) {
      const unsigned idx = b.qs[4 * ib + l] | (((qh >> (3 * l)) & 7u) << 8);
      iq1_emit8(idx, s, out.q + 32 * ib + 8 * l);
    }
  }
}

template <class F16>
[[maybe_unused]] inline void decode_iq1m(const quant::BlockIq1M& b, F16 f16, DecodedIq& out) {
  uint16_t sc[4];
  std::memcpy(sc, b.scales, sizeof(sc));
  // The f16 super-scale is the top nibble of each of the four scale words.
  const uint16_t d_bits =
      uint16_t((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000));
  out.d = f16(d_bits) * 0.125f;
  for (int ib = 0; ib < 8; ++ib) {
    const int shift = 6 * (ib % 2);  // two 3-bit sub-scales per 32 inputs
    out.scale[2 * ib] = int16_t(2 * ((sc[ib / 2] >> shift) & 7) + 1);
    out.scale[2 * ib + 1] = int16_t(2 * ((sc[ib / 2] >> (shift + 3)) & 7) + 1);
    for (int l = 0; l < 4; ++l) {
      // qh nibble per 8 inputs: 3 high index bits, then the delta sign (bit 3).
      const unsigned nib = (b.qh[2 * ib + l / 2] >> (4 * (l % 2))) & 0x0f;
      const unsigned idx = b.qs[4 * ib + l] | ((nib & 7u) << 8);
      iq1_emit8(idx, (nib & 8) ? -1 : 1, out.q + 32 * ib + 8 * l);
    }
  }
}

}  // namespace
}  // namespace aff::cpu::isa
