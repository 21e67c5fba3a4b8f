// AVX-512 kernels for the codebook ("IQ") formats, against activations in transposed-
// group order (ActFormat::kQ8KT: a 64-byte step holds row k of each of the eight
// 32-input groups, so a group's scale sits in fixed lanes 2g, 2g+1 of every step and is
// applied once per super-block in f32 instead of once per step).
//
// Needs AVX-512 VBMI, BITALG and GFNI besides VNNI: the grid rows are decoded with byte
// permutes (vpermb, vpermi2b) and an 8x8 bit transpose (gf2p8affineqb) instead of scalar
// table loads and inserts, which on Intel cores all queue for one shuffle port. (Every
// CPU with VBMI + BITALG, Ice Lake and Zen 4 onwards, also has GFNI.)
//
// IQ2_XXS (the DeepSeek-V4 q2 expert format) is decoded with its signs folded into the
// weight lookup, so a 64-weight step costs one vpermb and one vpdpbusd:
//   - each grid row's eight magnitudes in {8, 25, 43} become a 2-bit code; two 256-byte
//     tables give the row's code bit planes (bit j of plane p: bit p of element j's code),
//     and a 128-byte table its sign byte (bit j: element j negative, parity included);
//   - for two rows (g, 2h), (g, 2h+1) the six plane/sign bytes go into qword g of one
//     register, and one gf2p8affineqb transposes every qword as an 8x8 bit matrix: byte j
//     then holds element j's (code, sign) of both rows, in bits 0-2 and 3-5;
//   - a 64-entry vpermb maps those bits to the weight biased by 64 (64 ± magnitude, in
//     [21, 107]), the unsigned operand of vpdpbusd; the bias adds 64 * (sum of a group's
//     inputs), which the accumulator starts from with the opposite sign (from the
//     activation's block sums), so no per-step sign or correction work remains.
// IQ2_XS (512-row grid, scales per 16) and IQ3_XXS (3-bit codes, two grid entries per
// row) reuse the same decode. IQ1_S and IQ1_M (2048-row grid) have their own VBMI kernels
// in gemv_iq1_avx512vbmi.cpp; without VBMI the codebook formats decode through gathers
// in gemv_iqgather_avx512.cpp (VNNI only, natural activation order).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backend/cpu/act_quant.h"
#include "backend/cpu/isa/gemv_isa.h"
#include "backend/cpu/isa/kernel_common.h"

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi,avx512bitalg,gfni,bmi2")
// GCC 12 flags the deliberately undefined upper halves inside its own intrinsics.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "backend/cpu/isa/avx512_common.h"
#include "backend/cpu/isa/iq_q8kt_driver.h"

namespace aff::cpu::isa {
namespace {

using quant::BlockIq2Xxs;

// Code of an IQ2 magnitude byte: 8 -> 0, 25 -> 1, 43 -> 2.
constexpr uint8_t iq2_code(uint8_t m) { return m == 8 ? 0 : m == 25 ? 1 : 2; }
constexpr uint8_t iq2_mag(int code) { return code == 0 ? 8 : code == 1 ? 25 : 43; }

// The bias added to every weight so that it is the unsigned vpdpbusd operand.
constexpr int kIq2Bias = 64;

// Compile-time tables and permute controls (constexpr, so no static initialiser runs
// code compiled for this TU's ISA on a CPU that lacks it). Rows of a pair of super-
// blocks are numbered r = 32s + 4g + k (block s, group g, row k of the group).
struct Iq2XxsTables {
  uint8_t plane_lo[256] = {};  // grid row i: bit j = bit 0 of element j's code
  uint8_t plane_hi[256] = {};  // grid row i: bit j = bit 1 of element j's code
  uint8_t signs[128] = {};     // 7-bit sign index -> sign byte (bit j: element j negative)
  // Byte r <- byte 8g+k of block s: the grid index of row r (also used for the sign
  // indices extracted to the same positions).
  uint8_t idx2_ctrl[64] = {};
  // Byte 8g+k (k < 4) <- bits 32+7k.. of qword g: the 7-bit sign index of row (g, k).
  uint8_t sign_field_ctrl[64] = {};
  // rows_ctrl[s][h] (vpermi2b of plane_lo, plane_hi): qword g gets, from byte 7 down, the
  // lo and hi planes of row (g, 2h) of block s, a hole for its sign byte, then the same
  // for row (g, 2h+1); bytes 1 and 0 are padding. sign_ctrl[s][h] (vpermb of the sign
  // bytes, merged into the holes at bytes 5 and 2).
  uint8_t rows_ctrl[2][2][64] = {};
  uint8_t sign_ctrl[2][2][64] = {};
  // gf2p8affineqb operand: byte j of each qword = 1 << j, so that output byte j, bit b
  // is bit j of input byte 7 - b (an 8x8 bit transpose).
  uint8_t transpose_x[64] = {};
  // After the transpose, byte j of qword g holds, for element j: bits 0-2 = (code bit 0,
  // code bit 1, sign) of row (g, 2h), bits 3-5 the same of row (g, 2h+1). wtab[e] maps
  // that byte to 64 ± magnitude of row 2h + e (vpermb: bits 6-7 ignored).
  uint8_t wtab[2][64] = {};
  // Byte 4m <- bits 60.. of qword m/2: the group's 4-bit scale in the low bits of dword m.
  uint8_t scale_ctrl[64] = {};
  float scale_f[16] = {};  // 4-bit scale s -> 2s+1

  constexpr Iq2XxsTables() {
    for (int i = 0; i < 256; ++i) {
      for (int j = 0; j < 8; ++j) {
        const uint8_t c = iq2_code(uint8_t(quant::kIq2xxsGrid[i] >> (8 * j)));
        plane_lo[i] |= uint8_t((c & 1) << j);
        plane_hi[i] |= uint8_t((c >> 1) << j);
      }
    }
    for (int i = 0; i < 128; ++i) signs[i] = quant::kSignsIq2xs[i];
    for (int s = 0; s < 2; ++s) {
      for (int g = 0; g < 8; ++g) {
        for (int k = 0; k < 4; ++k) idx2_ctrl[32 * s + 4 * g + k] = uint8_t(64 * s + 8 * g + k);
      }
    }
    for (int g = 0; g < 8; ++g) {
      for (int k = 0; k < 4; ++k) sign_field_ctrl[8 * g + k] = uint8_t(32 + 7 * k);
    }
    for (int s = 0; s < 2; ++s) {
      for (int h = 0; h < 2; ++h) {
        for (int g = 0; g < 8; ++g) {
          const int r0 = 32 * s + 4 * g + 2 * h, r1 = r0 + 1;
          uint8_t* rc = rows_ctrl[s][h] + 8 * g;
          uint8_t* sc = sign_ctrl[s][h] + 8 * g;
          rc[7] = uint8_t(r0), rc[6] = uint8_t(64 + r0), rc[4] = uint8_t(r1), rc[3] = uint8_t(64 + r1);
          sc[5] = uint8_t(r0), sc[2] = uint8_t(r1);
        }
      }
    }
    for (int i = 0; i < 64; ++i) transpose_x[i] = uint8_t(1u << (i % 8));
    for (int e = 0; e < 2; ++e) {
      for (int i = 0; i < 64; ++i) {
        const int f = i >> (3 * e);
        const int code = f & 3, neg = (f >> 2) & 1;
        // Code 3 never occurs in a grid row.
        const int m = code == 3 ? 0 : iq2_mag(code);
        wtab[e][i] = uint8_t(neg ? kIq2Bias - m : kIq2Bias + m);
      }
    }
    for (int m = 0; m < 16; ++m) scale_ctrl[4 * m] = 60;
    for (int s = 0; s < 16; ++s) scale_f[s] = float(2 * s + 1);
  }
};
constexpr Iq2XxsTables kIq2Xxs{};

inline __m512i load64(const void* p) { return _mm512_loadu_si512(p); }

// 64 bytes of lookups: byte i = table[idx byte i] for a 256-entry table (four 64-byte
// registers; bit 7 of the index picks the upper pair).
inline __m512i lookup256(__m512i idx, __mmask64 upper, const uint8_t* table) {
  const __m512i lo = _mm512_permutex2var_epi8(load64(table), idx, load64(table + 64));
  const __m512i hi = _mm512_permutex2var_epi8(load64(table + 128), idx, load64(table + 192));
  return _mm512_mask_blend_epi8(upper, lo, hi);
}

// Lanes 2g, 2g+1: 2 s_g + 1 as f32, where qword g of s2 is 2 s_g plus a stray low bit
// (a 4-bit scale shifted down to bit 1): the OR with 1 overwrites the stray bit and the
// rotate copies the value into the upper dword. Shifts, rotates and ternlog avoid the
// shuffle port that the decode saturates.
inline __m512 odd_scales_ps(__m512i s2) {
  return _mm512_cvtepi32_ps(_mm512_ternarylogic_epi64(s2, _mm512_rol_epi64(s2, 32), _mm512_set1_epi32(1), 0xfe));
}

// Rows of a pair of super-blocks, from their code planes and sign bytes (byte r of lo,
// hi, signs: row r = 32s + 4g + k) to rows[s][h]: qword g, byte j = element j's (code,
// sign) of rows (g, 2h), (g, 2h+1) of block s (see wtab).
inline void assemble_rows(__m512i lo, __m512i hi, __m512i signs, __m512i rows[2][2]) {
  const Iq2XxsTables& T = kIq2Xxs;
  const __m512i tx = load64(T.transpose_x);
  for (int s = 0; s < 2; ++s) {
    for (int h = 0; h < 2; ++h) {
      __m512i r = _mm512_permutex2var_epi8(lo, load64(T.rows_ctrl[s][h]), hi);
      r = _mm512_mask_permutexvar_epi8(r, __mmask64(0x2424242424242424ull), load64(T.sign_ctrl[s][h]), signs);
      rows[s][h] = _mm512_gf2p8affine_epi64_epi8(tx, r, 0);
    }
  }
}

struct Iq2XxsDot {
  using Block = BlockIq2Xxs;
  static constexpr int64_t kElems = 256;
  static constexpr int kCorr = 1;
  static constexpr float kDScale = 0.125f;  // weight = d * (2s + 1) / 8 * grid

  // One vector: -64 * (sum of group g's inputs) in lane 2g (bsums[2g] + bsums[2g+1], 16
  // natural-order inputs each), 0 in lane 2g+1: both lanes of a group carry one scale.
  static void prepare_corr(const ActQ8K& a, int32_t* corr) {
    const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.bsums));
    _mm512_storeu_si512(corr, _mm512_cvtepu32_epi64(_mm256_madd_epi16(bs, _mm256_set1_epi16(-kIq2Bias))));
  }

  // Decodes two super-blocks (q0, q1: their 64 code bytes; qword g of each: four grid
  // indices, then four 7-bit sign indices and the 4-bit scale of group g).
  static void decode_pair(const Block&, const Block&, __m512i q0, __m512i q1, __m512i rows[2][2]) {
    const Iq2XxsTables& T = kIq2Xxs;
    const __m512i idx2 = load64(T.idx2_ctrl);
    const __m512i idx = _mm512_permutex2var_epi8(q0, idx2, q1);
    const __mmask64 upper = _mm512_movepi8_mask(idx);
    const __m512i lo = lookup256(idx, upper, T.plane_lo), hi = lookup256(idx, upper, T.plane_hi);
    const __m512i field_ctrl = load64(T.sign_field_ctrl);
    const __m512i fields = _mm512_permutex2var_epi8(_mm512_multishift_epi64_epi8(field_ctrl, q0), idx2,
                                                    _mm512_multishift_epi64_epi8(field_ctrl, q1));
    assemble_rows(lo, hi, _mm512_permutex2var_epi8(load64(T.signs), fields, load64(T.signs + 64)), rows);
  }

  // One super-block's four steps from its decoded rows (q: its 64 code bytes, for the
  // scales). acc[t] += sum over the block of w * x_t, in the same order whatever N.
  template <int N>
  static void block_steps(const Block&, __m512i q, const __m512i rows[2], const IqActPrep* p, int64_t b,
                          __m512* acc) {
    const Iq2XxsTables& T = kIq2Xxs;
    // Lanes 2g, 2g+1: 2 s_g + 1, the group's scale without d / 8 (ggml: d * (0.5 + s) / 4).
    // s_g is bits 60-63 of qword g: a shift by 59 leaves 2 s_g plus one bit of a sign
    // index.
    const __m512i s2 = _mm512_srli_epi64(q, 59);
    const __m512 scale = odd_scales_ps(s2);
    __m512i sumi[N];
    // Start from the bias correction: the weights' +64 cancels exactly.
    for (int t = 0; t < N; ++t) sumi[t] = load64(p[t].corr + 16 * b);
    for (int k = 0; k < 4; ++k) {
      const __m512i wv = _mm512_permutexvar_epi8(rows[k >> 1], load64(T.wtab[k & 1]));
      // |sum| over four steps <= 16*107*127 + 64*32*127 < 2^31.
      for (int t = 0; t < N; ++t) sumi[t] = _mm512_dpbusd_epi32(sumi[t], wv, load64(p[t].a[b].qs + 64 * k));
    }
    for (int t = 0; t < N; ++t) {
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[t]), _mm512_mul_ps(scale, _mm512_set1_ps(p[t].dd[b])), acc[t]);
    }
  }

  static __m512i codes(const Block& blk) { return load64(blk.qs); }
};

// IQ2_XS: per row (8 inputs) a u16 = 9-bit grid index | 7-bit sign index << 9, and a
// 4-bit scale per 16 inputs (rows k = 0, 1 and k = 2, 3 of a group: low and high nibble
// of scales[g]). The grid has 512 rows of magnitudes in {8, 25, 43}, so the planes are
// looked up in 512-byte tables (bits 7 and 8 of the index pick the quarter); the rest is
// IQ2_XXS's decode. Two accumulators per block, one per scale.
struct Iq2XsTables {
  uint8_t plane_lo[512] = {};
  uint8_t plane_hi[512] = {};
  // Byte r = 32s + l <- byte 2l (low byte of row l's u16) / 2l + 1 (high byte) of block s.
  uint8_t lo_ctrl[64] = {};
  uint8_t hi_ctrl[64] = {};
  // Dword m: bits 8(m/2) (low nibble) / 8(m/2) + 4 (high nibble) of the 8 scale bytes.
  uint8_t scale_ctrl[2][64] = {};

  constexpr Iq2XsTables() {
    for (int i = 0; i < 512; ++i) {
      for (int j = 0; j < 8; ++j) {
        const uint8_t c = iq2_code(uint8_t(quant::kIq2xsGrid[i] >> (8 * j)));
        plane_lo[i] |= uint8_t((c & 1) << j);
        plane_hi[i] |= uint8_t((c >> 1) << j);
      }
    }
    for (int s = 0; s < 2; ++s) {
      for (int l = 0; l < 32; ++l) {
        lo_ctrl[32 * s + l] = uint8_t(64 * s + 2 * l);
        hi_ctrl[32 * s + l] = uint8_t(64 * s + 2 * l + 1);
      }
    }
    for (int m = 0; m < 16; ++m) {
      scale_ctrl[0][4 * m] = uint8_t(8 * (m / 2));
      scale_ctrl[1][4 * m] = uint8_t(8 * (m / 2) + 4);
    }
  }
};
constexpr Iq2XsTables kIq2Xs{};

struct Iq2XsDot {
  using Block = quant::BlockIq2Xs;
  static constexpr int64_t kElems = 256;
  static constexpr int kCorr = 2;
  static constexpr float kDScale = 0.125f;

  // Two vectors, for steps 0-1 and 2-3 (inputs 32g .. 32g+15 and 32g+16 .. 32g+31 of
  // group g): -64 * bsums[2g] and -64 * bsums[2g+1] in lane 2g, 0 in lane 2g+1.
  static void prepare_corr(const ActQ8K& a, int32_t* corr) {
    const __m512i bs = _mm512_mullo_epi32(block_sums(a), _mm512_set1_epi32(-kIq2Bias));
    _mm512_storeu_si512(corr, _mm512_maskz_mov_epi32(__mmask16(0x5555), bs));
    _mm512_storeu_si512(corr + 16, _mm512_srli_epi64(bs, 32));
  }

  // 512-entry lookup: bit 7 of idx (lo byte) and bit 0 of hib (bit 8 of the index) pick
  // the quarter.
  static __m512i lookup512(__m512i idx, __mmask64 b7, __mmask64 b8, const uint8_t* table) {
    const __m512i q01 = lookup256(idx, b7, table), q23 = lookup256(idx, b7, table + 256);
    return _mm512_mask_blend_epi8(b8, q01, q23);
  }

  static void decode_pair(const Block&, const Block&, __m512i q0, __m512i q1, __m512i rows[2][2]) {
    const Iq2XsTables& T = kIq2Xs;
    const Iq2XxsTables& X = kIq2Xxs;
    const __m512i idx = _mm512_permutex2var_epi8(q0, load64(T.lo_ctrl), q1);
    const __m512i hib = _mm512_permutex2var_epi8(q0, load64(T.hi_ctrl), q1);
    const __mmask64 b7 = _mm512_movepi8_mask(idx), b8 = _mm512_test_epi8_mask(hib, _mm512_set1_epi8(1));
    const __m512i lo = lookup512(idx, b7, b8, T.plane_lo), hi = lookup512(idx, b7, b8, T.plane_hi);
    // Sign index: bits 1-7 of the high byte (vpermi2b ignores bit 7 of the shifted byte).
    const __m512i signs = _mm512_permutex2var_epi8(load64(X.signs), _mm512_srli_epi16(hib, 1), load64(X.signs + 64));
    assemble_rows(lo, hi, signs, rows);
  }

  template <int N>
  static void block_steps(const Block& blk, __m512i, const __m512i rows[2], const IqActPrep* p, int64_t b,
                          __m512* acc) {
    const Iq2XsTables& T = kIq2Xs;
    const Iq2XxsTables& X = kIq2Xxs;
    // The eight scale bytes in every qword; lanes 2g, 2g+1 of scale[e]: 2 s + 1 of
    // nibble e of scales[g] (multishift to the low bits, then the (2s+1) table).
    uint64_t sc8;
    std::memcpy(&sc8, blk.scales, 8);
    const __m512i sc = _mm512_set1_epi64(int64_t(sc8));
    const __m512 tab = _mm512_loadu_ps(X.scale_f);
    __m512i sumi[2][N];
    for (int e = 0; e < 2; ++e) {
      for (int t = 0; t < N; ++t) sumi[e][t] = load64(p[t].corr + 32 * b + 16 * e);
    }
    for (int k = 0; k < 4; ++k) {
      const __m512i wv = _mm512_permutexvar_epi8(rows[k >> 1], load64(X.wtab[k & 1]));
      // |sum| over two steps <= 8*107*127 + 64*16*127 < 2^31.
      for (int t = 0; t < N; ++t) {
        sumi[k >> 1][t] = _mm512_dpbusd_epi32(sumi[k >> 1][t], wv, load64(p[t].a[b].qs + 64 * k));
      }
    }
    for (int e = 0; e < 2; ++e) {
      const __m512 scale = _mm512_permutexvar_ps(_mm512_multishift_epi64_epi8(load64(T.scale_ctrl[e]), sc), tab);
      for (int t = 0; t < N; ++t) {
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[e][t]), _mm512_mul_ps(scale, _mm512_set1_ps(p[t].dd[b])),
                                 acc[t]);
      }
    }
  }

  // The 32 u16 rows (64 bytes, after d).
  static __m512i codes(const Block& blk) { return load64(blk.qs); }
};

// IQ3_XXS: 64 grid indices of 4 magnitudes in {4, 12, ..., 52, 62} (3-bit codes), then per
// group of 32 a u32 of four 7-bit sign indices (one per row of 8) and a 4-bit scale. A row
// takes two grid entries; per element three code bits and the sign (4 bits), so a qword
// holds two rows: after the transpose, byte j has row (g, 2h) in bits 0-3 and (g, 2h+1)
// in bits 4-7 (shifted down by a word shift for its vpermb). One super-block per decode:
// its 64 grid indices fill the lookup register.
struct Iq3XxsTables {
  // Grid entry i: bit e = bit p of element e's code, the nibble repeated in both halves
  // (so one 8-bit multishift window over a row's two entries reads n0 | n1 << 4).
  uint8_t plane[3][256] = {};
  // plane_ctrl[h][p]: byte 7 - p <- bits 16 (2h) + 4 of qword g (row (g, 2h): its entries
  // are bytes 2k, 2k+1 of qword g), byte 3 - p <- bits 16 (2h + 1) + 4.
  uint8_t plane_ctrl[2][3][64] = {};
  // sign_ctrl[h]: byte 4 <- bits 7 (2h) (row (g, 2h)'s sign index in the group's u32),
  // byte 0 <- bits 7 (2h + 1).
  uint8_t sign_ctrl[2][64] = {};
  // Byte j of the transposed qword: bits 0-2 code, bit 3 sign of one row -> 64 ± magnitude
  // (vpermb: bits 4-5 ignored).
  uint8_t wtab[64] = {};

  static constexpr int code(uint8_t m) { return m == 62 ? 7 : (m - 4) / 8; }
  static constexpr int mag(int c) { return c == 7 ? 62 : 4 + 8 * c; }

  constexpr Iq3XxsTables() {
    for (int i = 0; i < 256; ++i) {
      for (int p = 0; p < 3; ++p) {
        uint8_t nib = 0;
        for (int e = 0; e < 4; ++e) nib |= uint8_t(((code(uint8_t(quant::kIq3xxsGrid[i] >> (8 * e))) >> p) & 1) << e);
        plane[p][i] = uint8_t(nib | nib << 4);
      }
    }
    for (int h = 0; h < 2; ++h) {
      for (int g = 0; g < 8; ++g) {
        for (int p = 0; p < 3; ++p) {
          plane_ctrl[h][p][8 * g + 7 - p] = uint8_t(16 * (2 * h) + 4);
          plane_ctrl[h][p][8 * g + 3 - p] = uint8_t(16 * (2 * h + 1) + 4);
        }
        sign_ctrl[h][8 * g + 4] = uint8_t(7 * (2 * h));
        sign_ctrl[h][8 * g + 0] = uint8_t(7 * (2 * h + 1));
      }
    }
    for (int i = 0; i < 64; ++i) {
      const int m = mag(i & 7);
      wtab[i] = uint8_t((i & 8) ? kIq2Bias - m : kIq2Bias + m);
    }
  }
};
constexpr Iq3XxsTables kIq3Xxs{};

struct Iq3XxsDot {
  using Block = quant::BlockIq3Xxs;
  static constexpr int64_t kElems = 256;
  static constexpr int kCorr = 1;
  static constexpr float kDScale = 0.25f;  // weight = d * (2s + 1) / 4 * grid

  static void prepare_corr(const ActQ8K& a, int32_t* corr) { Iq2XxsDot::prepare_corr(a, corr); }

  // qword g = group g's u32 (sign indices, scale).
  static __m512i aux(const Block& blk) {
    return _mm512_cvtepu32_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qs + 64)));
  }

  static void decode_one(__m512i q, __m512i ax, __m512i rows[2]) {
    const Iq3XxsTables& T = kIq3Xxs;
    const Iq2XxsTables& X = kIq2Xxs;
    const __mmask64 upper = _mm512_movepi8_mask(q);
    __m512i planes[3];
    for (int p = 0; p < 3; ++p) planes[p] = lookup256(q, upper, T.plane[p]);
    for (int h = 0; h < 2; ++h) {
      __m512i r = _mm512_multishift_epi64_epi8(load64(T.plane_ctrl[h][0]), planes[0]);
      r = _mm512_mask_multishift_epi64_epi8(r, __mmask64(0x4444444444444444ull), load64(T.plane_ctrl[h][1]), planes[1]);
      r = _mm512_mask_multishift_epi64_epi8(r, __mmask64(0x2222222222222222ull), load64(T.plane_ctrl[h][2]), planes[2]);
      // Sign indices into bytes 4 and 0, then looked up in place (lanes outside the mask
      // keep r: the index form of vpermi2b).
      r = _mm512_mask_multishift_epi64_epi8(r, __mmask64(0x1111111111111111ull), load64(T.sign_ctrl[h]), ax);
      r = _mm512_mask2_permutex2var_epi8(load64(X.signs), r, __mmask64(0x1111111111111111ull), load64(X.signs + 64));
      rows[h] = _mm512_gf2p8affine_epi64_epi8(load64(X.transpose_x), r, 0);
    }
  }

  static void decode_pair(const Block& b0, const Block& b1, __m512i q0, __m512i q1, __m512i rows[2][2]) {
    decode_one(q0, aux(b0), rows[0]);
    decode_one(q1, aux(b1), rows[1]);
  }

  template <int N>
  static void block_steps(const Block& blk, __m512i, const __m512i rows[2], const IqActPrep* p, int64_t b,
                          __m512* acc) {
    const Iq3XxsTables& T = kIq3Xxs;
    // Lanes 2g, 2g+1: 2 s_g + 1 from bits 28-31 of the group's u32 (shift by 27, OR 1,
    // copy to the upper dword), as for IQ2_XXS.
    const __m512i s2 = _mm512_srli_epi64(aux(blk), 27);
    const __m512 scale = odd_scales_ps(s2);
    __m512i sumi[N];
    for (int t = 0; t < N; ++t) sumi[t] = load64(p[t].corr + 16 * b);
    const __m512i wt = load64(T.wtab);
    for (int k = 0; k < 4; ++k) {
      const __m512i r = (k & 1) ? _mm512_srli_epi16(rows[k >> 1], 4) : rows[k >> 1];
      const __m512i wv = _mm512_permutexvar_epi8(r, wt);
      // |sum| over four steps <= 16*126*127 + 64*32*127 < 2^31.
      for (int t = 0; t < N; ++t) sumi[t] = _mm512_dpbusd_epi32(sumi[t], wv, load64(p[t].a[b].qs + 64 * k));
    }
    for (int t = 0; t < N; ++t) {
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[t]), _mm512_mul_ps(scale, _mm512_set1_ps(p[t].dd[b])), acc[t]);
    }
  }

  // The 64 grid indices.
  static __m512i codes(const Block& blk) { return load64(blk.qs); }
};

// One row against N prepared activations, two super-blocks per iteration: their 64 grid
// indices fill one register, so each table permute does 64 useful lookups. Inlined into
// the row loop so that the ~20 table registers are loaded once per call, not per row.
template <class K, int N>
[[gnu::always_inline]] inline void iq_dot(const typename K::Block* w, const IqActPrep* p, int64_t nb, float* out) {
  row_scales<N>(w, p, nb);
  __m512 acc[N];
  for (int t = 0; t < N; ++t) acc[t] = _mm512_setzero_ps();
  int64_t b = 0;
  for (; b + 1 < nb; b += 2) {
    const __m512i q0 = K::codes(w[b]), q1 = K::codes(w[b + 1]);
    __m512i rows[2][2];
    K::decode_pair(w[b], w[b + 1], q0, q1, rows);
    K::template block_steps<N>(w[b], q0, rows[0], p, b, acc);
    K::template block_steps<N>(w[b + 1], q1, rows[1], p, b + 1, acc);
  }
  if (b < nb) {
    const __m512i q = K::codes(w[b]);
    __m512i rows[2][2];
    K::decode_pair(w[b], w[b], q, q, rows);
    K::template block_steps<N>(w[b], q, rows[0], p, b, acc);
  }
  for (int t = 0; t < N; ++t) out[t] = _mm512_reduce_add_ps(acc[t]);
}

// The formats above as the row drivers (iq_q8kt_driver.h) call them.
template <class K>
struct PairRows : K {
  template <int N>
  [[gnu::always_inline]] static void dot_row(const typename K::Block* w, const IqActPrep* p, int64_t nb, float* out) {
    iq_dot<K, N>(w, p, nb, out);
  }
};

}  // namespace

void gemv_iq2xxs_q8kt_avx512vbmi(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* act,
                                 float* y) {
  iq_gemv<PairRows<Iq2XxsDot>>(w, rb, rows, cols, act, y);
}
void gemm_iq2xxs_q8kt_avx512vbmi(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* act,
                                 int64_t act_stride, int64_t n, float* y, int64_t ldy) {
  iq_gemm<PairRows<Iq2XxsDot>>(w, rb, rows, cols, act, act_stride, n, y, ldy);
}
void gemv_iq2xs_q8kt_avx512vbmi(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* act,
                                float* y) {
  iq_gemv<PairRows<Iq2XsDot>>(w, rb, rows, cols, act, y);
}
void gemm_iq2xs_q8kt_avx512vbmi(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* act,
                                int64_t act_stride, int64_t n, float* y, int64_t ldy) {
  iq_gemm<PairRows<Iq2XsDot>>(w, rb, rows, cols, act, act_stride, n, y, ldy);
}
void gemv_iq3xxs_q8kt_avx512vbmi(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* act,
                                 float* y) {
  iq_gemv<PairRows<Iq3XxsDot>>(w, rb, rows, cols, act, y);
}
void gemm_iq3xxs_q8kt_avx512vbmi(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* act,
                                 int64_t act_stride, int64_t n, float* y, int64_t ldy) {
  iq_gemm<PairRows<Iq3XxsDot>>(w, rb, rows, cols, act, act_stride, n, y, ldy);
}

}  // namespace aff::cpu::isa

#pragma GCC diagnostic pop
#pragma GCC pop_options
#else
namespace aff::cpu::isa {
AFF_UNREACHABLE_GEMV(gemv_iq2xxs_q8kt_avx512vbmi)
AFF_UNREACHABLE_GEMV(gemv_iq2xs_q8kt_avx512vbmi)
AFF_UNREACHABLE_GEMV(gemv_iq3xxs_q8kt_avx512vbmi)
AFF_UNREACHABLE_GEMM(gemm_iq2xxs_q8kt_avx512vbmi)
AFF_UNREACHABLE_GEMM(gemm_iq2xs_q8kt_avx512vbmi)
AFF_UNREACHABLE_GEMM(gemm_iq3xxs_q8kt_avx512vbmi)
}  // namespace aff::cpu::isa
#endif
