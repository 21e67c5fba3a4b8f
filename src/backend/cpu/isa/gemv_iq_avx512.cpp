// AVX-512 kernels for the codebook ("IQ") formats, against activations in transposed-
// group order (ActFormat::kQ8KT: a 64-byte step holds row k of each of the eight
// 32-input groups, so a group's scale sits in fixed lanes 2g, 2g+1 of every step and is
// applied once per super-block in f32 instead of once per step).
//
// Needs AVX-512 VBMI and BITALG besides VNNI: the grid rows are decoded with byte permutes
// (vpermb, vpermi2b) and per-byte bit-field extraction (vpmultishiftqb) instead of
// scalar table loads and inserts, which on Intel cores all queue for one shuffle port.
//
// IQ2_XXS (the DeepSeek-V4 q2 expert format) is fully in registers:
//   - the 256-entry grid of 8 magnitudes in {8, 25, 43} is held as two 256-byte tables of
//     2-bit codes (elements 0-3, elements 4-7); four vpermi2b look up all 32 rows of a
//     super-block at once and leave row (g, k)'s 16-bit code in word k of qword g;
//   - one vpmultishiftqb per step pulls each element's 2-bit code into its own byte and a
//     64-entry vpermb maps it to the magnitude;
//   - the 7-bit sign indices become sign bytes through a 128-entry vpermi2b (the parity bit
//     included), and each step's 64-bit mask comes from them by one vpshufbitqmb (BITALG).
// The rarer codebook formats (IQ2_XS, IQ3_XXS, IQ1_S, IQ1_M) decode through iq_decode.h
// in gemv_avx512.cpp instead (VNNI only, natural activation order).
#include <cstdint>
#include <cstring>

#include "backend/cpu/act_quant.h"
#include "backend/cpu/isa/gemv_isa.h"
#include "backend/cpu/isa/kernel_common.h"

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi,avx512bitalg,bmi2")
// GCC 12 flags the deliberately undefined upper halves inside its own intrinsics.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "backend/cpu/isa/avx512_common.h"

namespace aff::cpu::isa {
namespace {

using quant::BlockIq2Xxs;

// Code of an IQ2 magnitude byte: 8 -> 0, 25 -> 1, 43 -> 2.
constexpr uint8_t iq2_code(uint8_t m) { return m == 8 ? 0 : m == 25 ? 1 : 2; }

// Compile-time tables and permute controls (constexpr, so no static initialiser runs
// code compiled for this TU's ISA on a CPU that lacks it).
struct Iq2XxsTables {
  uint8_t code_lo[256] = {};  // row i: codes of elements 0-3 at bits 0,2,4,6
  uint8_t code_hi[256] = {};  // row i: codes of elements 4-7
  uint8_t signs[128] = {};    // 7-bit sign index -> sign byte (bit j: element j negative)
  uint8_t mag[64] = {};       // vpermb table: low 2 bits of the index -> magnitude
  // Byte 8g+2k+e (e = 0, 1) <- byte 8g+k of the block: grid index of row (g, k), twice,
  // so the code lookups leave row (g, k)'s lo/hi code bytes in word k of qword g.
  uint8_t idx_ctrl[64] = {};
  // Step k: byte j of each qword <- the 8 bits from 16k + 2j (element j's code at bit 0).
  uint8_t shift_ctrl[4][64] = {};
  // Byte 8g+k (k < 4) <- bits 32+7k.. of qword g: the 7-bit sign index of row (g, k).
  uint8_t sign_field_ctrl[64] = {};
  // Step k of block s of a pair: byte 8g+j <- bit 8(4s+k)+j of qword g of the sign bytes
  // (vpshufbitqmb), i.e. bit j of row (g, k)'s sign byte: the step's negative weights.
  uint8_t bit_ctrl[2][4][64] = {};
  // Byte 4m <- bits 60.. of qword m/2: the group's 4-bit scale in the low bits of dword m.
  uint8_t scale_ctrl[64] = {};
  float scale_f[16] = {};     // 4-bit scale s -> 2s+1
  // Two blocks at once (block s = 0, 1 of a pair):
  // idx2: byte 32s+4g+k <- byte 8g+k of block s (its grid index of row (g, k));
  uint8_t idx2_ctrl[64] = {};
  // code2[s]: byte 8g+2k <- lo code byte 32s+4g+k, byte 8g+2k+1 <- the hi code byte;
  uint8_t code2_ctrl[2][64] = {};
  // sign2: byte 8g+4s+k <- byte 8g+k of block s's extracted sign indices, so qword g of
  // the looked-up sign bytes holds rows (g, 0..3) of both blocks.
  uint8_t sign2_ctrl[64] = {};

  constexpr Iq2XxsTables() {
    for (int i = 0; i < 256; ++i) {
      for (int j = 0; j < 8; ++j) {
        const uint8_t c = iq2_code(uint8_t(quant::kIq2xxsGrid[i] >> (8 * j)));
        if (j < 4) code_lo[i] |= uint8_t(c << (2 * j));
        else code_hi[i] |= uint8_t(c << (2 * (j - 4)));
      }
    }
    for (int i = 0; i < 128; ++i) signs[i] = quant::kSignsIq2xs[i];
    for (int i = 0; i < 64; ++i) mag[i] = (i & 3) == 0 ? 8 : (i & 3) == 1 ? 25 : 43;
    for (int g = 0; g < 8; ++g) {
      for (int k = 0; k < 4; ++k) {
        idx_ctrl[8 * g + 2 * k] = idx_ctrl[8 * g + 2 * k + 1] = uint8_t(8 * g + k);
        sign_field_ctrl[8 * g + k] = uint8_t(32 + 7 * k);
        for (int bs = 0; bs < 2; ++bs) {
          for (int j = 0; j < 8; ++j) bit_ctrl[bs][k][8 * g + j] = uint8_t(8 * (4 * bs + k) + j);
        }
      }
      for (int j = 0; j < 8; ++j) {
        for (int k = 0; k < 4; ++k) shift_ctrl[k][8 * g + j] = uint8_t(16 * k + 2 * j);
      }
    }
    for (int bs = 0; bs < 2; ++bs) {
      for (int g = 0; g < 8; ++g) {
        for (int k = 0; k < 4; ++k) {
          idx2_ctrl[32 * bs + 4 * g + k] = uint8_t(64 * bs + 8 * g + k);
          code2_ctrl[bs][8 * g + 2 * k] = uint8_t(32 * bs + 4 * g + k);
          code2_ctrl[bs][8 * g + 2 * k + 1] = uint8_t(64 + 32 * bs + 4 * g + k);
          sign2_ctrl[8 * g + 4 * bs + k] = uint8_t(64 * bs + 8 * g + k);
        }
      }
    }
    for (int m = 0; m < 16; ++m) scale_ctrl[4 * m] = 60;
    for (int s = 0; s < 16; ++s) scale_f[s] = float(2 * s + 1);
  }
};
constexpr Iq2XxsTables kIq2Xxs{};

inline __m512i load64(const void* p) { return _mm512_loadu_si512(p); }

// 64 bytes of 2-bit-coded lookups: byte i = table[idx byte i] for a 256-entry table
// (four 64-byte registers; bit 7 of the index picks the upper pair).
inline __m512i lookup256(__m512i idx, const uint8_t* table) {
  const __m512i lo = _mm512_permutex2var_epi8(load64(table), idx, load64(table + 64));
  const __m512i hi = _mm512_permutex2var_epi8(load64(table + 128), idx, load64(table + 192));
  return _mm512_mask_blend_epi8(_mm512_movepi8_mask(idx), lo, hi);
}

struct Iq2XxsDot {
  using Block = BlockIq2Xxs;
  using Act = ActQ8K;  // kQ8KT order
  static constexpr int64_t kElems = 256;

  // One super-block's steps once its codes and sign masks are decoded:
  //   code: qword g holds row (g, k)'s 16-bit code in word k;
  //   signs: qword g holds the sign bytes of rows (g, 0..3) in bytes 4s .. 4s+3;
  //   q: the block's 64 code bytes (for the scales).
  // The step masks come straight from the sign bytes by vpshufbitqmb: no store and
  // reload, whose failed store-to-load forward would serialise the blocks.
  // acc[t] += sum over the block of w * x_t, in the same order whatever the caller.
  template <int N>
  static void block_steps(const Block& w, __m512i q, __m512i code, __m512i signs, int s, const Act* const* a,
                          int64_t b, __m512* acc) {
    const Iq2XxsTables& T = kIq2Xxs;
    const __m512i mag = load64(T.mag);
    // Lanes 2g, 2g+1: (2 s_g + 1) * d / 8, the group's scale (ggml: d * (0.5 + s) / 4).
    const __m512 scale = _mm512_mul_ps(
        _mm512_permutexvar_ps(_mm512_multishift_epi64_epi8(load64(T.scale_ctrl), q), _mm512_loadu_ps(T.scale_f)),
        _mm512_set1_ps(f16(w.d) * 0.125f));
    __m512i sumi[N];
    for (int t = 0; t < N; ++t) sumi[t] = _mm512_setzero_si512();
    for (int k = 0; k < 4; ++k) {
      const __m512i wv = _mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(load64(T.shift_ctrl[k]), code), mag);
      const __mmask64 nk = _mm512_bitshuffle_epi64_mask(signs, load64(T.bit_ctrl[s][k]));
      for (int t = 0; t < N; ++t) {
        const __m512i x = load64(a[t][b].qs + 64 * k);
        // |sum| over four steps <= 4*4*43*127 < 2^31.
        sumi[t] = _mm512_dpbusd_epi32(sumi[t], wv, _mm512_mask_sub_epi8(x, nk, _mm512_setzero_si512(), x));
      }
    }
    for (int t = 0; t < N; ++t) {
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[t]), _mm512_mul_ps(scale, _mm512_set1_ps(a[t][b].d)), acc[t]);
    }
  }

  template <int N>
  static void dot(const Block* w, const Act* const* a, int64_t nb, float* out) {
    const Iq2XxsTables& T = kIq2Xxs;
    const __m512i sign_field_ctrl = load64(T.sign_field_ctrl);
    __m512 acc[N];
    for (int t = 0; t < N; ++t) acc[t] = _mm512_setzero_ps();
    int64_t b = 0;
    // Two super-blocks per iteration: their 64 grid indices fill one register, so each
    // code-table permute does 64 useful lookups instead of 32.
    for (; b + 1 < nb; b += 2) {
      const __m512i q0 = load64(w[b].qs), q1 = load64(w[b + 1].qs);
      const __m512i idx = _mm512_permutex2var_epi8(q0, load64(T.idx2_ctrl), q1);
      const __m512i lo = lookup256(idx, T.code_lo), hi = lookup256(idx, T.code_hi);
      const __m512i code0 = _mm512_permutex2var_epi8(lo, load64(T.code2_ctrl[0]), hi);
      const __m512i code1 = _mm512_permutex2var_epi8(lo, load64(T.code2_ctrl[1]), hi);
      const __m512i fields = _mm512_permutex2var_epi8(_mm512_multishift_epi64_epi8(sign_field_ctrl, q0),
                                                      load64(T.sign2_ctrl),
                                                      _mm512_multishift_epi64_epi8(sign_field_ctrl, q1));
      const __m512i signs = _mm512_permutex2var_epi8(load64(T.signs), fields, load64(T.signs + 64));
      block_steps<N>(w[b], q0, code0, signs, 0, a, b, acc);
      block_steps<N>(w[b + 1], q1, code1, signs, 1, a, b + 1, acc);
    }
    if (b < nb) {
      // qword g of the 64 code bytes: four grid indices, then four 7-bit sign indices
      // and the 4-bit scale (bits 60..63) of group g.
      const __m512i q = load64(w[b].qs);
      const __m512i idx = _mm512_permutexvar_epi8(load64(T.idx_ctrl), q);
      const __m512i code = _mm512_mask_blend_epi8(__mmask64(0xaaaaaaaaaaaaaaaaull), lookup256(idx, T.code_lo),
                                                  lookup256(idx, T.code_hi));
      const __m512i sign_idx = _mm512_multishift_epi64_epi8(sign_field_ctrl, q);
      const __m512i signs = _mm512_permutex2var_epi8(load64(T.signs), sign_idx, load64(T.signs + 64));
      block_steps<N>(w[b], q, code, signs, 0, a, b, acc);
    }
    for (int t = 0; t < N; ++t) out[t] = _mm512_reduce_add_ps(acc[t]);
  }
};

}  // namespace

AFF_AVX512_KERNELS(iq2xxs_q8kt, avx512vbmi, Iq2XxsDot)
#undef AFF_AVX512_KERNELS

}  // namespace aff::cpu::isa

#pragma GCC diagnostic pop
#pragma GCC pop_options
#else
namespace aff::cpu::isa {
#define AFF_UNREACHABLE_GEMV(name) \
  void name(const uint8_t*, int64_t, int64_t, int64_t, const void*, float*) { __builtin_trap(); }
AFF_UNREACHABLE_GEMV(gemv_iq2xxs_q8kt_avx512vbmi)
#define AFF_UNREACHABLE_GEMM(name) \
  void name(const uint8_t*, int64_t, int64_t, int64_t, const void*, int64_t, int64_t, float*, int64_t) { __builtin_trap(); }
AFF_UNREACHABLE_GEMM(gemm_iq2xxs_q8kt_avx512vbmi)
}  // namespace aff::cpu::isa
#endif
