// ggml block layouts, byte-for-byte (ggml-common.h). Each struct is one block as it lies in
// a GGUF tensor row; rows are arrays of blocks with no padding. Scales stored as f16 are kept
// as raw uint16_t bits so the structs stay trivially copyable and exactly sized.
#pragma once

#include <cstdint>

namespace aff::quant {

inline constexpr int kQK = 32;     // elements per block of the 32-wide formats
inline constexpr int kQK_K = 256;  // elements per super-block of the K and IQ formats

// Q8_0: x[j] = d * qs[j].
struct BlockQ8_0 {
  uint16_t d;      // f16 scale
  int8_t qs[kQK];  // quants
};
static_assert(sizeof(BlockQ8_0) == 34);

// MXFP4 (OCP MX, ggml packing): byte j holds element j (low nibble) and j+16 (high nibble);
// x = kValuesMxfp4[code] * 2^(e-127) / 2.
struct BlockMxfp4 {
  uint8_t e;             // E8M0 shared exponent
  uint8_t qs[kQK / 2];   // E2M1 codes
};
static_assert(sizeof(BlockMxfp4) == 17);

// IQ4_NL: x = d * kValuesIq4nl[code]; byte j holds element j (low) and j+16 (high).
struct BlockIq4Nl {
  uint16_t d;
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockIq4Nl) == 18);

// Q2_K: 16 sub-blocks of 16; scales[i] low nibble = scale, high nibble = min.
struct BlockQ2K {
  uint8_t scales[kQK_K / 16];
  uint8_t qs[kQK_K / 4];  // 2-bit quants, four per byte at shifts 0,2,4,6 over 32-byte groups
  uint16_t d;             // f16 super-scale for scales
  uint16_t dmin;          // f16 super-scale for mins
};
static_assert(sizeof(BlockQ2K) == 84);

// Q3_K: 16 sub-blocks of 16 with signed 6-bit scales (stored +32).
struct BlockQ3K {
  uint8_t hmask[kQK_K / 8];  // high bit of each 3-bit quant (set => no -4 offset)
  uint8_t qs[kQK_K / 4];     // low 2 bits
  uint8_t scales[12];        // 16 x 6 bits, packed
  uint16_t d;                // f16 super-scale
};
static_assert(sizeof(BlockQ3K) == 110);

// Q4_K: 8 sub-blocks of 32 with 6-bit scale and 6-bit min each.
struct BlockQ4K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qs[kQK_K / 2];  // 32-byte chunks: low nibbles = sub-block 2k, high = 2k+1
};
static_assert(sizeof(BlockQ4K) == 144);

// Q5_K: Q4_K plus one high bit per element.
struct BlockQ5K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockQ5K) == 176);

// Q6_K: 16 sub-blocks of 16, signed 8-bit scales, 6-bit quants stored -32.
struct BlockQ6K {
  uint8_t ql[kQK_K / 2];
  uint8_t qh[kQK_K / 4];
  int8_t scales[kQK_K / 16];
  uint16_t d;
};
static_assert(sizeof(BlockQ6K) == 210);

// IQ4_XS: 8 sub-blocks of 32, 6-bit scales (stored +32), non-linear 4-bit values.
struct BlockIq4Xs {
  uint16_t d;
  uint16_t scales_h;             // 2 high bits per sub-block
  uint8_t scales_l[kQK_K / 64];  // 4 low bits per sub-block
  uint8_t qs[kQK_K / 2];         // per 32: byte j = element j (low) and j+16 (high)
};
static_assert(sizeof(BlockIq4Xs) == 136);

// IQ2_XXS: per 32 elements two u32 words: word 0 = four 8-bit grid indices, word 1 = four
// 7-bit sign indices (bits 0..27) and a 4-bit scale (bits 28..31).
struct BlockIq2Xxs {
  uint16_t d;
  uint16_t qs[kQK_K / 8];
};
static_assert(sizeof(BlockIq2Xxs) == 66);

// IQ2_XS: per 8 elements a u16 = 9-bit grid index | 7-bit sign index << 9; two 4-bit
// scales per 32 elements.
struct BlockIq2Xs {
  uint16_t d;
  uint16_t qs[kQK_K / 8];
  uint8_t scales[kQK_K / 32];
};
static_assert(sizeof(BlockIq2Xs) == 74);

// IQ3_XXS: 64 grid indices (4 elements each), then per 32 elements a u32 of four 7-bit
// sign indices and a 4-bit scale.
struct BlockIq3Xxs {
  uint16_t d;
  uint8_t qs[3 * kQK_K / 8];
};
static_assert(sizeof(BlockIq3Xxs) == 98);

// IQ1_S: per 32 elements: four 8-bit low index bytes in qs, and a u16 in qh holding four
// 3-bit high index parts (bits 0..11), a 3-bit scale (12..14) and the delta sign (15).
struct BlockIq1S {
  uint16_t d;
  uint8_t qs[kQK_K / 8];
  uint16_t qh[kQK_K / 32];
};
static_assert(sizeof(BlockIq1S) == 50);

// IQ1_M: qh byte per 16 elements = two (3 high index bits | delta-sign bit) nibbles;
// scales = four u16 words of 4 x 3-bit sub-scales, whose top nibbles together form the
// f16 super-scale.
struct BlockIq1M {
  uint8_t qs[kQK_K / 8];
  uint8_t qh[kQK_K / 16];
  uint8_t scales[kQK_K / 32];
};
static_assert(sizeof(BlockIq1M) == 56);

inline constexpr float kIq1Delta = 0.125f;

}  // namespace aff::quant
