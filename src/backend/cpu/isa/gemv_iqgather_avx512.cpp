// AVX-512 + VNNI kernels for the codebook formats whose grids are too large to hold in
// registers (IQ2_XS: 512 rows, IQ1_S/IQ1_M: 2048) or whose rows are split in halves
// (IQ3_XXS): each 64-input step fetches its eight grid rows (sixteen half-rows for
// IQ3_XXS) with one vpgatherdq / vpgatherdd, and its sign masks with a second gather from
// a 128-entry table of byte masks (IQ2/IQ3) or from IQ1 rows stored pre-shifted to 8g ± 1.
// The scalar super-block decode these formats used before (iq_decode.h, still the AVX2
// path) cost ~1.5 cycles per weight; this is the whole decode in vector registers.
//
// Activations in natural order (ActQ8K). A step's 64 inputs hold sub-blocks 4c .. 4c+3 of
// 16; each format provides, per super-block, the sixteen sub-block scales (positive,
// < 2^15, as (scale, 0) word pairs for vpdpwssd) and d, and per step the unsigned weight
// magnitudes and the mask of negative weights.
#include <cstdint>
#include <cstring>

#include "backend/cpu/act_quant.h"
#include "backend/cpu/isa/gemv_isa.h"
#include "backend/cpu/isa/iq_decode.h"
#include "backend/cpu/isa/kernel_common.h"

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,bmi2")
// GCC 12 flags the deliberately undefined upper halves inside its own intrinsics.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "backend/cpu/isa/avx512_common.h"

namespace aff::cpu::isa {
namespace {

const long long* as_ll(const void* p) { return static_cast<const long long*>(p); }
const int* as_int(const void* p) { return static_cast<const int*>(p); }

// (2s + 1) for sixteen 4-bit or 3-bit scales given one per byte.
inline __m512i odd_scales(__m128i s8) {
  return _mm512_add_epi32(_mm512_slli_epi32(_mm512_cvtepu8_epi32(s8), 1), _mm512_set1_epi32(1));
}

// Sign masks of eight rows from their 7-bit sign indices (eight dwords).
inline __mmask64 iq2_neg(__m256i sign_idx) {
  const __m256i i = _mm256_and_si256(sign_idx, _mm256_set1_epi32(127));
  return _mm512_movepi8_mask(_mm512_i32gather_epi64(i, as_ll(kIqDecode.sign_mask), 8));
}

// IQ2_XS: per 8 inputs a u16 = 9-bit grid index | 7-bit sign index << 9; scales per 16.
struct Iq2XsRows {
  using Block = quant::BlockIq2Xs;
  static float scales(const Block& b, __m512i* sc32) {
    const __m128i s8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.scales));
    const __m128i m4 = _mm_set1_epi8(0x0f);
    // Sub-block 2ib: low nibble of scales[ib], 2ib+1: high nibble.
    *sc32 = odd_scales(_mm_unpacklo_epi8(_mm_and_si128(s8, m4), _mm_and_si128(_mm_srli_epi16(s8, 4), m4)));
    return f16(b.d) * 0.125f;
  }
  static void step(const Block& b, int c, __m512i* mag, __mmask64* neg) {
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + 8 * c)));
    *mag = _mm512_i32gather_epi64(_mm256_and_si256(v, _mm256_set1_epi32(511)), as_ll(quant::kIq2xsGrid), 8);
    *neg = iq2_neg(_mm256_srli_epi32(v, 9));
  }
};

// IQ3_XXS: 64 grid indices of 4 magnitudes, then per 32 inputs a u32 of four 7-bit sign
// indices and a 4-bit scale.
struct Iq3XxsRows {
  using Block = quant::BlockIq3Xxs;
  static float scales(const Block& b, __m512i* sc32) {
    const __m256i ss = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 64));
    const __m256i s = _mm256_srli_epi32(ss, 28);  // per group of 32
    // Sub-blocks 2g and 2g+1 share group g's scale.
    const __m512i dup = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    const __m512i s16 = _mm512_permutexvar_epi32(dup, _mm512_castsi256_si512(s));
    *sc32 = _mm512_add_epi32(_mm512_slli_epi32(s16, 1), _mm512_set1_epi32(1));
    return f16(b.d) * 0.25f;
  }
  static void step(const Block& b, int c, __m512i* mag, __mmask64* neg) {
    const __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + 16 * c)));
    *mag = _mm512_i32gather_epi32(idx, as_int(quant::kIq3xxsGrid), 4);
    // Rows 0-3: group 2c, rows 4-7: group 2c+1; row l's sign index at bit 7l.
    const __m256i ss = _mm256_setr_m128i(_mm_set1_epi32(int(load_u32(b.qs + 64 + 8 * c))),
                                         _mm_set1_epi32(int(load_u32(b.qs + 68 + 8 * c))));
    *neg = iq2_neg(_mm256_srlv_epi32(ss, _mm256_setr_epi32(0, 7, 14, 21, 0, 7, 14, 21)));
  }
};

// IQ1 rows from kIqDecode.iq1_rows (8g + 1 at [idx][0], 8g - 1 at [idx][1]), given eight
// row indices (11 bits) and eight delta-sign bits (1 = negative delta).
inline void iq1_rows(__m256i idx, __m256i minus, __m512i* mag, __mmask64* neg) {
  const __m256i t = _mm256_or_si256(_mm256_slli_epi32(idx, 1), minus);
  const __m512i q = _mm512_i32gather_epi64(t, as_ll(kIqDecode.iq1_rows), 8);
  *neg = _mm512_movepi8_mask(q);
  *mag = _mm512_abs_epi8(q);
}

// IQ1_S: per 32 inputs four low index bytes and a u16 of four 3-bit high parts, a 3-bit
// scale and the delta sign.
struct Iq1SRows {
  using Block = quant::BlockIq1S;
  static float scales(const Block& b, __m512i* sc32) {
    const __m128i qh = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qh));
    const __m128i s = _mm_and_si128(_mm_srli_epi16(qh, 12), _mm_set1_epi16(7));  // 8 x u16
    // Bytes: sub-blocks 2g and 2g+1 both get group g's scale.
    const __m128i s8 = _mm_shuffle_epi8(s, _mm_setr_epi8(0, 0, 2, 2, 4, 4, 6, 6, 8, 8, 10, 10, 12, 12, 14, 14));
    *sc32 = odd_scales(s8);
    return f16(b.d) * 0.125f;
  }
  static void step(const Block& b, int c, __m512i* mag, __mmask64* neg) {
    const __m256i lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.qs + 8 * c)));
    const __m256i qh = _mm256_setr_m128i(_mm_set1_epi32(b.qh[2 * c]), _mm_set1_epi32(b.qh[2 * c + 1]));
    const __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(qh, _mm256_setr_epi32(0, 3, 6, 9, 0, 3, 6, 9)),
                                        _mm256_set1_epi32(7));
    iq1_rows(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 8)), _mm256_srli_epi32(qh, 15), mag, neg);
  }
};

// IQ1_M: a qh nibble per 8 inputs (3 high index bits, delta sign), four u16 scale words
// holding 3-bit sub-scales per 16 inputs and, in their top nibbles, the f16 super-scale.
struct Iq1MRows {
  using Block = quant::BlockIq1M;
  static float scales(const Block& b, __m512i* sc32) {
    uint16_t sc[4];
    std::memcpy(sc, b.scales, sizeof(sc));
    const uint16_t d_bits =
        uint16_t((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000));
    // Sub-block i: bits 3*(i%4) of word i/4.
    const __m512i words = _mm512_permutexvar_epi32(_mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0),
                                                   _mm512_cvtepu16_epi32(_mm256_zextsi128_si256(_mm_loadl_epi64(
                                                       reinterpret_cast<const __m128i*>(b.scales)))));
    const __m512i s = _mm512_and_si512(
        _mm512_srlv_epi32(words, _mm512_set_epi32(9, 6, 3, 0, 9, 6, 3, 0, 9, 6, 3, 0, 9, 6, 3, 0)),
        _mm512_set1_epi32(7));
    *sc32 = _mm512_add_epi32(_mm512_slli_epi32(s, 1), _mm512_set1_epi32(1));
    return f16(d_bits) * 0.125f;
  }
  static void step(const Block& b, int c, __m512i* mag, __mmask64* neg) {
    const __m256i lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.qs + 8 * c)));
    // Row r of the step: nibble r of the four qh bytes 4c .. 4c+3.
    const __m256i nib = _mm256_and_si256(
        _mm256_srlv_epi32(_mm256_set1_epi32(int(load_u32(b.qh + 4 * c))), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
        _mm256_set1_epi32(15));
    const __m256i hi = _mm256_slli_epi32(_mm256_and_si256(nib, _mm256_set1_epi32(7)), 8);
    iq1_rows(_mm256_or_si256(lo, hi), _mm256_srli_epi32(nib, 3), mag, neg);
  }
};

template <class F>
struct IqGatherDot {
  using Block = typename F::Block;
  using Act = ActQ8K;
  static constexpr int64_t kElems = 256;
  template <int N>
  static void dot(const Block* w, const Act* const* a, int64_t nb, float* out) {
    // Lane l of 64-input step c belongs to sub-block 4c + l/4.
    __m512i lane_sub[4];
    for (int c = 0; c < 4; ++c) {
      lane_sub[c] = _mm512_set_epi32(4 * c + 3, 4 * c + 3, 4 * c + 3, 4 * c + 3, 4 * c + 2, 4 * c + 2, 4 * c + 2,
                                     4 * c + 2, 4 * c + 1, 4 * c + 1, 4 * c + 1, 4 * c + 1, 4 * c, 4 * c, 4 * c, 4 * c);
    }
    __m512 acc[N];
    for (int t = 0; t < N; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      __m512i sc32;
      const float d = F::scales(w[b], &sc32);
      __m512i sumi[N];
      for (int t = 0; t < N; ++t) sumi[t] = _mm512_setzero_si512();
      for (int c = 0; c < 4; ++c) {
        __m512i mag;
        __mmask64 neg;
        F::step(w[b], c, &mag, &neg);
        const __m512i scv = _mm512_permutexvar_epi32(lane_sub[c], sc32);
        for (int t = 0; t < N; ++t) {
          const __m512i x = _mm512_loadu_si512(a[t][b].qs + 64 * c);
          const __m512i xs = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
          // Four products of magnitudes <= 62 with |x| <= 127 stay below 2^15.
          sumi[t] = _mm512_dpwssd_epi32(sumi[t], _mm512_dpbusd_epi32(_mm512_setzero_si512(), mag, xs), scv);
        }
      }
      for (int t = 0; t < N; ++t) {
        acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(d * a[t][b].d), _mm512_cvtepi32_ps(sumi[t]), acc[t]);
      }
    }
    for (int t = 0; t < N; ++t) out[t] = _mm512_reduce_add_ps(acc[t]);
  }
};

}  // namespace

AFF_AVX512_KERNELS(iq2xs_q8k, avx512, IqGatherDot<Iq2XsRows>)
AFF_AVX512_KERNELS(iq3xxs_q8k, avx512, IqGatherDot<Iq3XxsRows>)
AFF_AVX512_KERNELS(iq1s_q8k, avx512, IqGatherDot<Iq1SRows>)
AFF_AVX512_KERNELS(iq1m_q8k, avx512, IqGatherDot<Iq1MRows>)
#undef AFF_AVX512_KERNELS

}  // namespace aff::cpu::isa

#pragma GCC diagnostic pop
#pragma GCC pop_options
#else
namespace aff::cpu::isa {
AFF_UNREACHABLE_GEMV(gemv_iq2xs_q8k_avx512)
AFF_UNREACHABLE_GEMV(gemv_iq3xxs_q8k_avx512)
AFF_UNREACHABLE_GEMV(gemv_iq1s_q8k_avx512)
AFF_UNREACHABLE_GEMV(gemv_iq1m_q8k_avx512)
AFF_UNREACHABLE_GEMM(gemm_iq2xs_q8k_avx512)
AFF_UNREACHABLE_GEMM(gemm_iq3xxs_q8k_avx512)
AFF_UNREACHABLE_GEMM(gemm_iq1s_q8k_avx512)
AFF_UNREACHABLE_GEMM(gemm_iq1m_q8k_avx512)
}  // namespace aff::cpu::isa
#endif
