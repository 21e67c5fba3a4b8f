// AVX2 kernels (with FMA and F16C). Integer products use the maddubs sign trick:
// |w| as unsigned times x with w's sign moved onto x, pairs summed to i16, then i32.
#include <cstdint>
#include <cstring>

#include "backend/cpu/act_quant.h"
#include "backend/cpu/isa/gemv_isa.h"
#include "backend/cpu/isa/iq_decode.h"
#include "backend/cpu/isa/kernel_common.h"

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

namespace aff::cpu::isa {
namespace {

using quant::BlockIq2Xxs;
using quant::BlockIq4Xs;
using quant::BlockQ3K;
using quant::BlockMxfp4;
using quant::BlockQ2K;
using quant::BlockQ4K;
using quant::BlockQ8_0;

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 8 x i32: sums of 4 consecutive products of signed bytes (|w| <= 128, x in [-127, 127]).
inline __m256i dot_i8(__m256i w, __m256i x) {
  const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
  return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
}

inline float f16(uint16_t h) { return _cvtsh_ss(h); }

float dot_q8_0(const BlockQ8_0* w, const ActQ8_0* a, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const __m256i wq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b].qs));
    const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b].qs));
    const __m256 p = _mm256_cvtepi32_ps(dot_i8(wq, xq));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(f16(w[b].d) * a[b].d), p, acc);
  }
  return hsum(acc);
}

// Broadcast masks for vpshufb: within each 128-bit lane, i16 element j everywhere.
inline __m256i i16_bcast_mask(int lo_j, int hi_j) {
  return _mm256_setr_m128i(_mm_set1_epi16(int16_t(((2 * lo_j + 1) << 8) | (2 * lo_j))),
                           _mm_set1_epi16(int16_t(((2 * hi_j + 1) << 8) | (2 * hi_j))));
}

float dot_q4k(const BlockQ4K* w, const ActQ8K* a, int64_t nb) {
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  __m256i bcast[8];
  for (int j = 0; j < 8; ++j) bcast[j] = i16_bcast_mask(j, j);
  __m256 acc = _mm256_setzero_ps(), acc_min = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    // All eight 6-bit scales and mins at once (word ops), as i16 in both 128-bit lanes.
    uint64_t sc, mn;
    q4k_unpack_scales(w[b].scales, &sc, &mn);
    const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(sc))));
    // The mins: sum_j m_j * (bsums[2j] + bsums[2j+1]), kept as 8 lanes until the end.
    const __m128i m8 = _mm_cvtsi64_si128(int64_t(mn));
    const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b].bsums));
    acc_min = _mm256_fmadd_ps(_mm256_set1_ps(f16(w[b].dmin) * a[b].d),
                              _mm256_cvtepi32_ps(_mm256_madd_epi16(bs, _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8)))),
                              acc_min);
    __m256i sumi = _mm256_setzero_si256();
    for (int k = 0; k < 4; ++k) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b].qs + 32 * k));
      const __m256i lo = _mm256_and_si256(q, m4);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
      const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b].qs + 64 * k));
      const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b].qs + 64 * k + 32));
      // maddubs pairs stay below 2*15*127: no saturation.
      const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, x0), _mm256_shuffle_epi8(sc16, bcast[2 * k]));
      const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, x1), _mm256_shuffle_epi8(sc16, bcast[2 * k + 1]));
      sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(f16(w[b].d) * a[b].d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum(acc) - hsum(acc_min);
}

float dot_q2k(const BlockQ2K* w, const ActQ8K* a, int64_t nb) {
  const __m256i m3 = _mm256_set1_epi8(3);
  // Step j of a 128-element half: low 16 elements are sub-block 2j, high 16 are 2j+1
  // (relative to the half's eight sub-blocks).
  __m256i bcast[4];
  for (int j = 0; j < 4; ++j) bcast[j] = i16_bcast_mask(2 * j, 2 * j + 1);
  __m256 acc = _mm256_setzero_ps(), acc_min = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const __m128i s8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[b].scales));
    const __m128i sc = _mm_and_si128(s8, _mm_set1_epi8(0x0f));
    // The mins: sum_i (scales[i] >> 4) * bsums[i], kept as 8 lanes until the end.
    const __m256i m16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s8, 4), _mm_set1_epi8(0x0f)));
    const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b].bsums));
    acc_min = _mm256_fmadd_ps(_mm256_set1_ps(f16(w[b].dmin) * a[b].d), _mm256_cvtepi32_ps(_mm256_madd_epi16(bs, m16)),
                              acc_min);
    // Scales of sub-blocks 8n..8n+7 as i16, in both 128-bit lanes.
    const __m256i sc16[2] = {_mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sc)),
                             _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_srli_si128(sc, 8)))};
    __m256i sumi = _mm256_setzero_si256();
    for (int n = 0; n < 2; ++n) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b].qs + 32 * n));
      for (int j = 0; j < 4; ++j) {
        // 32 elements 128n + 32j..: first 16 are sub-block 8n+2j, next 16 sub-block 8n+2j+1.
        const __m256i q2 = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m3);
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b].qs + 128 * n + 32 * j));
        sumi = _mm256_add_epi32(
            sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(q2, x), _mm256_shuffle_epi8(sc16[n], bcast[j])));
      }
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(f16(w[b].d) * a[b].d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum(acc) - hsum(acc_min);
}

float dot_iq2xxs(const BlockIq2Xxs* w, const ActQ8K* a, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const float d = f16(w[b].d) * a[b].d * 0.125f;
    __m256i sumi = _mm256_setzero_si256();
    for (int ib = 0; ib < 8; ++ib) {
      const uint32_t g = load_u32(w[b].qs + 4 * ib);      // four 8-bit grid indices
      const uint32_t ss = load_u32(w[b].qs + 4 * ib + 2); // four 7-bit sign indices, 4-bit scale
      const __m256i gv = _mm256_set_epi64x(
          int64_t(quant::kIq2xxsGrid[g >> 24]), int64_t(quant::kIq2xxsGrid[(g >> 16) & 255]),
          int64_t(quant::kIq2xxsGrid[(g >> 8) & 255]), int64_t(quant::kIq2xxsGrid[g & 255]));
      const __m256i sv = _mm256_set_epi64x(
          int64_t(kIq2SignBytes.v[(ss >> 21) & 127]), int64_t(kIq2SignBytes.v[(ss >> 14) & 127]),
          int64_t(kIq2SignBytes.v[(ss >> 7) & 127]), int64_t(kIq2SignBytes.v[ss & 127]));
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b].qs + 32 * ib));
      const __m256i p = _mm256_maddubs_epi16(gv, _mm256_sign_epi8(x, sv));
      sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, _mm256_set1_epi16(int16_t(2 * (ss >> 28) + 1))));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum(acc);
}

float dot_mxfp4(const BlockMxfp4* w, const ActQ8_0* a, int64_t nb) {
  const __m128i values = _mm_loadu_si128(reinterpret_cast<const __m128i*>(quant::kValuesMxfp4));
  const __m128i m4 = _mm_set1_epi8(0x0f);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[b].qs));
    const __m128i lo = _mm_shuffle_epi8(values, _mm_and_si128(q, m4));
    const __m128i hi = _mm_shuffle_epi8(values, _mm_and_si128(_mm_srli_epi16(q, 4), m4));
    const __m256i wv = _mm256_set_m128i(hi, lo);
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b].qs));
    const __m256 p = _mm256_cvtepi32_ps(dot_i8(wv, x));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(kMxfp4Scales.v[w[b].e] * a[b].d), p, acc);
  }
  return hsum(acc);
}

float dot_q3k(const BlockQ3K* w, const ActQ8K* a, int64_t nb) {
  const __m256i m3 = _mm256_set1_epi8(3);
  const __m256i four = _mm256_set1_epi8(4);
  // As in Q2_K: step j of a 128-input half covers sub-blocks 2j and 2j+1 of that half.
  __m256i bcast[4];
  for (int j = 0; j < 4; ++j) bcast[j] = i16_bcast_mask(2 * j, 2 * j + 1);
  __m256 acc = _mm256_setzero_ps(), acc_corr = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    uint32_t sw[4];
    q3k_scale_words(w[b].scales, sw);
    const __m128i sc8 = _mm_sub_epi8(_mm_set_epi32(int(sw[3]), int(sw[2]), int(sw[1]), int(sw[0])), _mm_set1_epi8(32));
    const __m256i sc16_all = _mm256_cvtepi8_epi16(sc8);
    // Codes are used as value + 4 in [0, 7]; the -4 comes back through the block sums.
    const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b].bsums));
    const float dd = f16(w[b].d) * a[b].d;
    acc_corr = _mm256_fmadd_ps(_mm256_set1_ps(4.0f * dd), _mm256_cvtepi32_ps(_mm256_madd_epi16(bs, sc16_all)),
                               acc_corr);
    const __m256i sc16[2] = {_mm256_broadcastsi128_si256(_mm256_castsi256_si128(sc16_all)),
                             _mm256_broadcastsi128_si256(_mm256_extracti128_si256(sc16_all, 1))};
    const __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b].hmask));
    __m256i sumi = _mm256_setzero_si256();
    for (int n = 0; n < 2; ++n) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b].qs + 32 * n));
      for (int j = 0; j < 4; ++j) {
        // Inputs 128n + 32j + l: low bits at shift 2j of qs[32n + l], high bit = bit 4n+j
        // of hmask[l].
        const __m256i bit = _mm256_set1_epi8(char(1 << (4 * n + j)));
        const __m256i hb = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit), four);
        const __m256i q3 = _mm256_add_epi8(_mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m3), hb);
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b].qs + 128 * n + 32 * j));
        // maddubs pairs <= 2*7*127: no saturation.
        sumi = _mm256_add_epi32(
            sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(q3, x), _mm256_shuffle_epi8(sc16[n], bcast[j])));
      }
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(dd), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum(acc) - hsum(acc_corr);
}

float dot_iq4xs(const BlockIq4Xs* w, const ActQ8K* a, int64_t nb) {
  const __m128i values = _mm_loadu_si128(reinterpret_cast<const __m128i*>(quant::kValuesIq4nl));
  const __m128i m4 = _mm_set1_epi8(0x0f);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m256i sumi = _mm256_setzero_si256();
    for (int ib = 0; ib < 8; ++ib) {
      // Byte j of the 16: input j (low nibble) and j + 16 (high nibble).
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[b].qs + 16 * ib));
      const __m128i lo = _mm_shuffle_epi8(values, _mm_and_si128(q, m4));
      const __m128i hi = _mm_shuffle_epi8(values, _mm_and_si128(_mm_srli_epi16(q, 4), m4));
      const __m256i wv = _mm256_set_m128i(hi, lo);
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b].qs + 32 * ib));
      // |w| <= 127: maddubs pairs <= 2*127*127 < 2^15; vpmaddwd applies the scale.
      const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(x, wv));
      const int16_t ls = int16_t(iq4xs_scale(w[b].scales_l, w[b].scales_h, ib));
      sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, _mm256_set1_epi16(ls)));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(f16(w[b].d) * a[b].d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum(acc);
}

// IQ2_XS, IQ3_XXS, IQ1_S, IQ1_M: super-block decoded by iq_decode.h to signed bytes and
// per-16 scales, then the maddubs sign trick (|q| <= 62: pairs < 2^15).
template <class B, void (*Decode)(const B&, DecodedIq&)>
float dot_iq_decoded(const B* w, const ActQ8K* a, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  // Decoded one super-block ahead (see gemv_avx512.cpp): no failed store forwards.
  DecodedIq ring[2];
  Decode(w[0], ring[0]);
  for (int64_t b = 0; b < nb; ++b) {
    if (b + 1 < nb) Decode(w[b + 1], ring[(b + 1) & 1]);
    const DecodedIq& dq = ring[b & 1];
    __m256i sumi = _mm256_setzero_si256();
    for (int c = 0; c < 8; ++c) {
      const __m256i q = _mm256_load_si256(reinterpret_cast<const __m256i*>(dq.q + 32 * c));
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b].qs + 32 * c));
      const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(x, q));
      const __m256i sc = _mm256_setr_m128i(_mm_set1_epi16(dq.scale[2 * c]), _mm_set1_epi16(dq.scale[2 * c + 1]));
      sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, sc));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(dq.d * a[b].d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum(acc);
}

void decode_iq2xs_blk(const quant::BlockIq2Xs& b, DecodedIq& o) { decode_iq2xs(b, f16, o); }
void decode_iq3xxs_blk(const quant::BlockIq3Xxs& b, DecodedIq& o) { decode_iq3xxs(b, f16, o); }
void decode_iq1s_blk(const quant::BlockIq1S& b, DecodedIq& o) { decode_iq1s(b, f16, o); }
void decode_iq1m_blk(const quant::BlockIq1M& b, DecodedIq& o) { decode_iq1m(b, f16, o); }

template <typename Block, typename Act, float (*Dot)(const Block*, const Act*, int64_t), int64_t kElems>
void gemv_rows(const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t cols, const void* act, float* y) {
  const auto* a = static_cast<const Act*>(act);
  for (int64_t r = 0; r < rows; ++r) {
    y[r] = Dot(reinterpret_cast<const Block*>(w + r * row_bytes), a, cols / kElems);
  }
}

}  // namespace

void gemv_q3k_q8k_avx2(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* a, float* y) {
  gemv_rows<BlockQ3K, ActQ8K, dot_q3k, 256>(w, rb, rows, cols, a, y);
}
void gemv_iq4xs_q8k_avx2(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* a, float* y) {
  gemv_rows<BlockIq4Xs, ActQ8K, dot_iq4xs, 256>(w, rb, rows, cols, a, y);
}
void gemv_iq2xs_q8k_avx2(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* a, float* y) {
  gemv_rows<quant::BlockIq2Xs, ActQ8K, dot_iq_decoded<quant::BlockIq2Xs, decode_iq2xs_blk>, 256>(w, rb, rows, cols,
                                                                                                  a, y);
}
void gemv_iq3xxs_q8k_avx2(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* a, float* y) {
  gemv_rows<quant::BlockIq3Xxs, ActQ8K, dot_iq_decoded<quant::BlockIq3Xxs, decode_iq3xxs_blk>, 256>(w, rb, rows,
                                                                                                      cols, a, y);
}
void gemv_iq1s_q8k_avx2(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* a, float* y) {
  gemv_rows<quant::BlockIq1S, ActQ8K, dot_iq_decoded<quant::BlockIq1S, decode_iq1s_blk>, 256>(w, rb, rows, cols, a,
                                                                                                y);
}
void gemv_iq1m_q8k_avx2(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* a, float* y) {
  gemv_rows<quant::BlockIq1M, ActQ8K, dot_iq_decoded<quant::BlockIq1M, decode_iq1m_blk>, 256>(w, rb, rows, cols, a,
                                                                                                y);
}

void gemv_q8_0_q8_0_avx2(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* a, float* y) {
  gemv_rows<BlockQ8_0, ActQ8_0, dot_q8_0, 32>(w, rb, rows, cols, a, y);
}
void gemv_q4k_q8k_avx2(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* a, float* y) {
  gemv_rows<BlockQ4K, ActQ8K, dot_q4k, 256>(w, rb, rows, cols, a, y);
}
void gemv_q2k_q8k_avx2(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* a, float* y) {
  gemv_rows<BlockQ2K, ActQ8K, dot_q2k, 256>(w, rb, rows, cols, a, y);
}
void gemv_iq2xxs_q8k_avx2(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* a, float* y) {
  gemv_rows<BlockIq2Xxs, ActQ8K, dot_iq2xxs, 256>(w, rb, rows, cols, a, y);
}
void gemv_mxfp4_q8_0_avx2(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* a, float* y) {
  gemv_rows<BlockMxfp4, ActQ8_0, dot_mxfp4, 32>(w, rb, rows, cols, a, y);
}

}  // namespace aff::cpu::isa

#pragma GCC pop_options
#else
// Not x86-64: the table never selects these (isa_supported is false without cpuid).
namespace aff::cpu::isa {
AFF_UNREACHABLE_GEMV(gemv_q8_0_q8_0_avx2)
AFF_UNREACHABLE_GEMV(gemv_q4k_q8k_avx2)
AFF_UNREACHABLE_GEMV(gemv_q2k_q8k_avx2)
AFF_UNREACHABLE_GEMV(gemv_iq2xxs_q8k_avx2)
AFF_UNREACHABLE_GEMV(gemv_mxfp4_q8_0_avx2)
AFF_UNREACHABLE_GEMV(gemv_q3k_q8k_avx2)
AFF_UNREACHABLE_GEMV(gemv_iq4xs_q8k_avx2)
AFF_UNREACHABLE_GEMV(gemv_iq2xs_q8k_avx2)
AFF_UNREACHABLE_GEMV(gemv_iq3xxs_q8k_avx2)
AFF_UNREACHABLE_GEMV(gemv_iq1s_q8k_avx2)
AFF_UNREACHABLE_GEMV(gemv_iq1m_q8k_avx2)
}  // namespace aff::cpu::isa
#endif
