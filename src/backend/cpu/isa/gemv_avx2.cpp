// AVX2 kernels (with FMA and F16C). Integer products use the maddubs sign trick:
// |w| as unsigned times x with w's sign moved onto x, pairs summed to i16, then i32.
#include <cstdint>
#include <cstring>

#include "backend/cpu/act_quant.h"
#include "backend/cpu/isa/gemv_isa.h"
#include "backend/cpu/isa/kernel_common.h"

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

namespace aff::cpu::isa {
namespace {

using quant::BlockIq2Xxs;
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

float dot_q4k(const BlockQ4K* w, const ActQ8K* a, int64_t nb) {
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  __m256 acc = _mm256_setzero_ps();
  float acc_min = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const float d = f16(w[b].d) * a[b].d;
    const float dmin = f16(w[b].dmin) * a[b].d;
    int sc[8], m[8];
    for (int j = 0; j < 8; ++j) q4k_scale_min(w[b].scales, j, &sc[j], &m[j]);
    int summ = 0;
    for (int j = 0; j < 8; ++j) summ += m[j] * (a[b].bsums[2 * j] + a[b].bsums[2 * j + 1]);
    acc_min += dmin * float(summ);
    __m256i sumi = _mm256_setzero_si256();
    for (int k = 0; k < 4; ++k) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b].qs + 32 * k));
      const __m256i lo = _mm256_and_si256(q, m4);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
      const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b].qs + 64 * k));
      const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b].qs + 64 * k + 32));
      const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, x0), _mm256_set1_epi16(int16_t(sc[2 * k])));
      const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, x1), _mm256_set1_epi16(int16_t(sc[2 * k + 1])));
      sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum(acc) - acc_min;
}

float dot_q2k(const BlockQ2K* w, const ActQ8K* a, int64_t nb) {
  const __m256i m3 = _mm256_set1_epi8(3);
  __m256 acc = _mm256_setzero_ps();
  float acc_min = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const float d = f16(w[b].d) * a[b].d;
    const float dmin = f16(w[b].dmin) * a[b].d;
    const uint8_t* s = w[b].scales;
    int summ = 0;
    for (int i = 0; i < 16; ++i) summ += (s[i] >> 4) * a[b].bsums[i];
    acc_min += dmin * float(summ);
    __m256i sumi = _mm256_setzero_si256();
    for (int n = 0; n < 2; ++n) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b].qs + 32 * n));
      for (int j = 0; j < 4; ++j) {
        // 32 elements 128n + 32j..: first 16 are sub-block 8n+2j, next 16 sub-block 8n+2j+1.
        const __m256i q2 = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m3);
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b].qs + 128 * n + 32 * j));
        const int t = 8 * n + 2 * j;
        const __m256i scv = _mm256_set_m128i(_mm_set1_epi16(int16_t(s[t + 1] & 0x0f)),
                                             _mm_set1_epi16(int16_t(s[t] & 0x0f)));
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(q2, x), scv));
      }
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum(acc) - acc_min;
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

template <typename Block, typename Act, float (*Dot)(const Block*, const Act*, int64_t), int64_t kElems>
void gemv_rows(const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t cols, const void* act, float* y) {
  const auto* a = static_cast<const Act*>(act);
  for (int64_t r = 0; r < rows; ++r) {
    y[r] = Dot(reinterpret_cast<const Block*>(w + r * row_bytes), a, cols / kElems);
  }
}

}  // namespace

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
#define AFF_UNREACHABLE_GEMV(name) \
  void name(const uint8_t*, int64_t, int64_t, int64_t, const void*, float*) { __builtin_trap(); }
AFF_UNREACHABLE_GEMV(gemv_q8_0_q8_0_avx2)
AFF_UNREACHABLE_GEMV(gemv_q4k_q8k_avx2)
AFF_UNREACHABLE_GEMV(gemv_q2k_q8k_avx2)
AFF_UNREACHABLE_GEMV(gemv_iq2xxs_q8k_avx2)
AFF_UNREACHABLE_GEMV(gemv_mxfp4_q8_0_avx2)
}  // namespace aff::cpu::isa
#endif
