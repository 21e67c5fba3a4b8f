// AVX-512 + VNNI kernels: two 32-element groups per ZMM register and vpdpbusd
// (u8 x s8, four products summed into each i32 lane). Signed weights go through the
// sign trick with a mask: |w| as unsigned, x negated where w < 0.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "backend/cpu/act_quant.h"
#include "backend/cpu/isa/gemv_isa.h"
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

using quant::BlockIq2Xxs;
using quant::BlockIq4Xs;
using quant::BlockQ3K;
using quant::BlockMxfp4;
using quant::BlockQ2K;
using quant::BlockQ4K;
using quant::BlockQ8_0;

// Q3_K's sixteen signed scales as bytes, sub-block i in byte i.
inline __m128i q3k_scales_i8(const uint8_t* s) {
  uint32_t w[4];
  q3k_scale_words(s, w);
  const __m128i u = _mm_set_epi32(int(w[3]), int(w[2]), int(w[1]), int(w[0]));
  return _mm_sub_epi8(u, _mm_set1_epi8(32));
}

// IQ4_XS's eight 6-bit scales (stored +32) as signed bytes in the low 8 bytes: nibble i
// of scales_l is the low part of scale i, bits 2i..2i+1 of scales_h the high part.
inline __m128i iq4xs_unpack_scales(const uint8_t* scales_l, uint16_t scales_h) {
  const uint64_t lo = _pdep_u64(load_u32(scales_l), 0x0f0f0f0f0f0f0f0full);
  const uint64_t hi = _pdep_u64(scales_h, 0x0303030303030303ull) << 4;
  return _mm_sub_epi8(_mm_cvtsi64_si128(int64_t(lo | hi)), _mm_set1_epi8(32));
}

// Each weight type is a struct with `dot<N>`: one weight row against N activations,
// out[t] = dot(row, a[t]). The weight decode (nibbles, grid rows, sign masks, scales)
// is done once per step and shared by the N tokens; every token keeps its own
// accumulators and the same operation order as N = 1, so the batched results are
// bit-identical to the GEMV ones.

struct Q8_0Dot {
  using Block = BlockQ8_0;
  using Act = ActQ8_0;
  static constexpr int64_t kElems = 32;
  template <int N>
  static void dot(const Block* w, const Act* const* a, int64_t nb, float* out) {
    __m512 acc[N];
    for (int t = 0; t < N; ++t) acc[t] = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 1 < nb; b += 2) {
      const __m512i wq = load2x256(w[b].qs, w[b + 1].qs);
      const __mmask64 neg = _mm512_movepi8_mask(wq);
      const __m512i wa = _mm512_abs_epi8(wq);  // -128 becomes 128 as an unsigned byte
      const float d0 = f16(w[b].d), d1 = f16(w[b + 1].d);
      for (int t = 0; t < N; ++t) {
        const __m512i xq = load2x256(a[t][b].qs, a[t][b + 1].qs);
        const __m512i xs = _mm512_mask_sub_epi8(xq, neg, _mm512_setzero_si512(), xq);
        const __m512 p = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), wa, xs));
        acc[t] = _mm512_fmadd_ps(split_ps(d0 * a[t][b].d, d1 * a[t][b + 1].d), p, acc[t]);
      }
    }
    float tail[N] = {};
    if (b < nb) {  // odd block count: one 256-bit step
      const __m256i wq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b].qs));
      const __mmask32 neg = _mm256_movepi8_mask(wq);
      const __m256i wa = _mm256_abs_epi8(wq);
      for (int t = 0; t < N; ++t) {
        const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[t][b].qs));
        const __m256i xs = _mm256_mask_sub_epi8(xq, neg, _mm256_setzero_si256(), xq);
        const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), wa, xs);
        tail[t] = f16(w[b].d) * a[t][b].d * hsum256(_mm256_cvtepi32_ps(p));
      }
    }
    for (int t = 0; t < N; ++t) out[t] = _mm512_reduce_add_ps(acc[t]) + tail[t];
  }
};

struct Q4KDot {
  using Block = BlockQ4K;
  using Act = ActQ8K;
  static constexpr int64_t kElems = 256;
  template <int N>
  static void dot(const Block* w, const Act* const* a, int64_t nb, float* out) {
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    // Low 256 bits keep the low nibbles, high 256 bits get the high nibbles.
    const __m512i shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    // Step k covers sub-blocks 2k (dot lanes 0-7) and 2k+1 (lanes 8-15).
    __m512i scale_idx[4];
    for (int k = 0; k < 4; ++k) {
      scale_idx[k] =
          _mm512_mask_blend_epi32(__mmask16(0xff00), _mm512_set1_epi32(2 * k), _mm512_set1_epi32(2 * k + 1));
    }
    __m512 acc[N];
    __m256 acc_min[N];
    for (int t = 0; t < N; ++t) acc[t] = _mm512_setzero_ps(), acc_min[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      uint64_t sc, mn;
      q4k_unpack_scales(w[b].scales, &sc, &mn);
      const __m512i sc32 = _mm512_cvtepu8_epi32(_mm_cvtsi64_si128(int64_t(sc)));
      // The mins: sum_j m_j * (bsums[2j] + bsums[2j+1]), kept as 8 lanes until the end.
      const __m128i m8 = _mm_cvtsi64_si128(int64_t(mn));
      const __m256i m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
      const float d = f16(w[b].d), dmin = f16(w[b].dmin);
      __m512i sumi[N];
      for (int t = 0; t < N; ++t) {
        const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[t][b].bsums));
        acc_min[t] = _mm256_fmadd_ps(_mm256_set1_ps(dmin * a[t][b].d), _mm256_cvtepi32_ps(_mm256_madd_epi16(bs, m16)),
                                     acc_min[t]);
        sumi[t] = _mm512_setzero_si512();
      }
      for (int k = 0; k < 4; ++k) {
        // Sub-blocks 2k (low nibbles) and 2k+1 (high nibbles) of the same 32 bytes; their
        // 64 activations are contiguous.
        const __m512i qq =
            _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b].qs + 32 * k)));
        const __m512i q4 = _mm512_and_si512(_mm512_srlv_epi16(qq, shift), m4);
        const __m512i scv = _mm512_permutexvar_epi32(scale_idx[k], sc32);
        for (int t = 0; t < N; ++t) {
          // |dot| <= 4*15*127 < 2^15: exact as i16, so vpdpwssd applies the 6-bit scale.
          const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q4, _mm512_loadu_si512(a[t][b].qs + 64 * k));
          sumi[t] = _mm512_dpwssd_epi32(sumi[t], p, scv);
        }
      }
      for (int t = 0; t < N; ++t) {
        acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(d * a[t][b].d), _mm512_cvtepi32_ps(sumi[t]), acc[t]);
      }
    }
    for (int t = 0; t < N; ++t) out[t] = _mm512_reduce_add_ps(acc[t]) - hsum256(acc_min[t]);
  }
};

struct Q2KDot {
  using Block = BlockQ2K;
  using Act = ActQ8K;
  static constexpr int64_t kElems = 256;
  template <int N>
  static void dot(const Block* w, const Act* const* a, int64_t nb, float* out) {
    const __m512i m3 = _mm512_set1_epi8(3);
    const __m512i shift01 = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    const __m512i shift23 = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1);
    // Lane l of 64-element chunk c belongs to sub-block 4c + l/4.
    __m512i lane_sub[4];
    for (int c = 0; c < 4; ++c) {
      alignas(64) int32_t idx[16];
      for (int l = 0; l < 16; ++l) idx[l] = 4 * c + l / 4;
      lane_sub[c] = _mm512_load_si512(idx);
    }
    __m512 acc[N];
    __m256 acc_min[N];
    for (int t = 0; t < N; ++t) acc[t] = _mm512_setzero_ps(), acc_min[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const __m128i s8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[b].scales));
      const __m512i sc32 = _mm512_and_si512(_mm512_cvtepu8_epi32(s8), _mm512_set1_epi32(15));
      // The mins: sum_i (scales[i] >> 4) * bsums[i], kept as 8 lanes until the end.
      const __m256i m16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s8, 4), _mm_set1_epi8(15)));
      const float d = f16(w[b].d), dmin = f16(w[b].dmin);
      __m512i sumi[N];
      for (int t = 0; t < N; ++t) {
        const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[t][b].bsums));
        acc_min[t] = _mm256_fmadd_ps(_mm256_set1_ps(dmin * a[t][b].d), _mm256_cvtepi32_ps(_mm256_madd_epi16(bs, m16)),
                                     acc_min[t]);
        sumi[t] = _mm512_setzero_si512();
      }
      for (int n = 0; n < 2; ++n) {
        const __m512i qq =
            _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b].qs + 32 * n)));
        for (int jj = 0; jj < 2; ++jj) {
          // Shifts 2*(2jj) and 2*(2jj+1): elements 128n + 64jj .. +64, contiguous in x.
          const __m512i q2 = _mm512_and_si512(_mm512_srlv_epi16(qq, jj ? shift23 : shift01), m3);
          const __m512i scv = _mm512_permutexvar_epi32(lane_sub[2 * n + jj], sc32);
          for (int t = 0; t < N; ++t) {
            // |dot| <= 4*3*127 < 2^15: exact as i16, so vpdpwssd applies the 4-bit scale.
            const __m512i x = _mm512_loadu_si512(a[t][b].qs + 128 * n + 64 * jj);
            sumi[t] = _mm512_dpwssd_epi32(sumi[t], _mm512_dpbusd_epi32(_mm512_setzero_si512(), q2, x), scv);
          }
        }
      }
      for (int t = 0; t < N; ++t) {
        acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(d * a[t][b].d), _mm512_cvtepi32_ps(sumi[t]), acc[t]);
      }
    }
    for (int t = 0; t < N; ++t) out[t] = _mm512_reduce_add_ps(acc[t]) - hsum256(acc_min[t]);
  }
};

struct Q3KDot {
  using Block = BlockQ3K;
  using Act = ActQ8K;
  static constexpr int64_t kElems = 256;
  template <int N>
  static void dot(const Block* w, const Act* const* a, int64_t nb, float* out) {
    const __m512i m3 = _mm512_set1_epi8(3);
    const __m512i four = _mm512_set1_epi8(4);
    const __m512i shift01 = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    const __m512i shift23 = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1);
    // Chunk c = 2n + jj holds elements 128n + 64jj .. +64 (as in Q2_K): low 2 bits at
    // shifts 2*(2jj) / 2*(2jj+1) of qs[32n..], high bit = bit 4n+2jj / 4n+2jj+1 of hmask.
    __m512i hbit[4], lane_sub[4];
    for (int c = 0; c < 4; ++c) {
      const int n = c / 2, jj = c % 2;
      hbit[c] = _mm512_inserti64x4(_mm512_set1_epi8(char(1 << (4 * n + 2 * jj))),
                                   _mm256_set1_epi8(char(1 << (4 * n + 2 * jj + 1))), 1);
      alignas(64) int32_t idx[16];
      for (int l = 0; l < 16; ++l) idx[l] = 4 * c + l / 4;
      lane_sub[c] = _mm512_load_si512(idx);
    }
    __m512 acc[N];
    __m256 acc_corr[N];
    for (int t = 0; t < N; ++t) acc[t] = _mm512_setzero_ps(), acc_corr[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      // Signed 6-bit scales, one byte per sub-block of 16.
      const __m128i sc8 = q3k_scales_i8(w[b].scales);
      // vpdpwssd reads each dword as two i16 words: the scale must sit in the low word
      // with a zero high word, even when negative.
      const __m512i sc32 = _mm512_and_si512(_mm512_cvtepi8_epi32(sc8), _mm512_set1_epi32(0xffff));
      // Codes are stored as q = value + 4 in [0, 7]; the -4 comes back through the
      // activation block sums: sum_s sc_s * 4 * bsums_s, 8 lanes kept until the end.
      const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
      const __m512i hm = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b].hmask)));
      const float d = f16(w[b].d);
      __m512i sumi[N];
      for (int t = 0; t < N; ++t) {
        const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[t][b].bsums));
        acc_corr[t] = _mm256_fmadd_ps(_mm256_set1_ps(4.0f * d * a[t][b].d),
                                      _mm256_cvtepi32_ps(_mm256_madd_epi16(bs, sc16)), acc_corr[t]);
        sumi[t] = _mm512_setzero_si512();
      }
      for (int n = 0; n < 2; ++n) {
        const __m512i qq =
            _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b].qs + 32 * n)));
        for (int jj = 0; jj < 2; ++jj) {
          const int c = 2 * n + jj;
          const __m512i lo = _mm512_and_si512(_mm512_srlv_epi16(qq, jj ? shift23 : shift01), m3);
          const __m512i q3 = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(hm, hbit[c]), lo, four);
          const __m512i scv = _mm512_permutexvar_epi32(lane_sub[c], sc32);
          for (int t = 0; t < N; ++t) {
            // |dot| <= 4*7*127 < 2^15: exact as i16, so vpdpwssd applies the scale.
            const __m512i x = _mm512_loadu_si512(a[t][b].qs + 64 * c);
            sumi[t] = _mm512_dpwssd_epi32(sumi[t], _mm512_dpbusd_epi32(_mm512_setzero_si512(), q3, x), scv);
          }
        }
      }
      for (int t = 0; t < N; ++t) {
        acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(d * a[t][b].d), _mm512_cvtepi32_ps(sumi[t]), acc[t]);
      }
    }
    for (int t = 0; t < N; ++t) out[t] = _mm512_reduce_add_ps(acc[t]) - hsum256(acc_corr[t]);
  }
};

struct Iq4XsDot {
  using Block = BlockIq4Xs;
  using Act = ActQ8K;
  static constexpr int64_t kElems = 256;
  template <int N>
  static void dot(const Block* w, const Act* const* a, int64_t nb, float* out) {
    // The non-linear values + 128, as unsigned bytes: vpdpbusd needs one unsigned side,
    // and the +128 comes back as 128 * (sum of the activations) per sub-block.
    alignas(16) uint8_t biased[16];
    for (int i = 0; i < 16; ++i) biased[i] = uint8_t(quant::kValuesIq4nl[i] + 128);
    const __m512i values = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(biased)));
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    // 128-bit lanes [A, A, B, B] of 32 code bytes: low/high nibbles of sub-block 2k, then 2k+1.
    const __m512i shift = _mm512_set_epi64(4 * 0x0001000100010001ll, 4 * 0x0001000100010001ll, 0, 0,
                                           4 * 0x0001000100010001ll, 4 * 0x0001000100010001ll, 0, 0);
    __m512i scale_idx[4];
    for (int k = 0; k < 4; ++k) {
      scale_idx[k] =
          _mm512_mask_blend_epi32(__mmask16(0xff00), _mm512_set1_epi32(2 * k), _mm512_set1_epi32(2 * k + 1));
    }
    __m512 acc[N];
    __m256 acc_corr[N];
    for (int t = 0; t < N; ++t) acc[t] = _mm512_setzero_ps(), acc_corr[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const __m128i sc8 = iq4xs_unpack_scales(w[b].scales_l, w[b].scales_h);  // 8 signed scales
      const __m512i sc32 = _mm512_cvtepi8_epi32(sc8);
      const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(sc8, sc8));  // one per 16 inputs
      const float d = f16(w[b].d);
      __m512i sumi[N];
      for (int t = 0; t < N; ++t) {
        const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[t][b].bsums));
        acc_corr[t] = _mm256_fmadd_ps(_mm256_set1_ps(128.0f * d * a[t][b].d),
                                      _mm256_cvtepi32_ps(_mm256_madd_epi16(bs, sc16)), acc_corr[t]);
        sumi[t] = _mm512_setzero_si512();
      }
      for (int k = 0; k < 4; ++k) {
        const __m512i q = _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b].qs + 32 * k)));
        const __m512i qq = _mm512_shuffle_i64x2(q, q, _MM_SHUFFLE(1, 1, 0, 0));
        const __m512i wv = _mm512_shuffle_epi8(values, _mm512_and_si512(_mm512_srlv_epi16(qq, shift), m4));
        const __m512i scv = _mm512_permutexvar_epi32(scale_idx[k], sc32);
        for (int t = 0; t < N; ++t) {
          // |dot| <= 4*241*127: too wide for the i16 trick, so a 32-bit multiply.
          const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv, _mm512_loadu_si512(a[t][b].qs + 64 * k));
          sumi[t] = _mm512_add_epi32(sumi[t], _mm512_mullo_epi32(p, scv));
        }
      }
      for (int t = 0; t < N; ++t) {
        acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(d * a[t][b].d), _mm512_cvtepi32_ps(sumi[t]), acc[t]);
      }
    }
    for (int t = 0; t < N; ++t) out[t] = _mm512_reduce_add_ps(acc[t]) - hsum256(acc_corr[t]);
  }
};

// Eight 7-bit IQ2 sign indices (bits 0..27 of s0 and s1, four each) -> a 64-bit mask,
// bit e set when element e of these 64 is negative. Each index is the low 7 bits of a
// sign byte whose bit 7 makes the parity even (ggml's ksigns_iq2xs), so the table
// lookup becomes a bit deposit plus a per-byte parity fold: ~12 ALU ops, no loads.
inline uint64_t iq2_sign_mask(uint32_t s0, uint32_t s1) {
  const uint64_t bits = uint64_t(s0 & 0x0fffffffu) | (uint64_t(s1 & 0x0fffffffu) << 28);
  const uint64_t b = _pdep_u64(bits, 0x7f7f7f7f7f7f7f7full);
  uint64_t p = b ^ (b >> 4);  // bit 0 of each byte ends up as the xor of that byte's bits
  p ^= p >> 2;
  p ^= p >> 1;
  return b | ((p & 0x0101010101010101ull) << 7);
}

// Two grid rows (8 bytes each) in one XMM.
inline __m128i grid2(const uint64_t* grid, unsigned i0, unsigned i1) {
  return _mm_insert_epi64(_mm_cvtsi64_si128(int64_t(grid[i0])), int64_t(grid[i1]), 1);
}

struct Iq2XxsDot {
  using Block = BlockIq2Xxs;
  using Act = ActQ8K;
  static constexpr int64_t kElems = 256;
  template <int N>
  static void dot(const Block* w, const Act* const* a, int64_t nb, float* out) {
    const uint64_t* grid = quant::kIq2xxsGrid;
    // Dword lane 2g+1 of a block's 64 code bytes holds group g's sign word (scale in bits
    // 28..31). Step k covers groups 2k (lanes 0-7 of the dot) and 2k+1 (lanes 8-15).
    __m512i scale_idx[4];
    for (int k = 0; k < 4; ++k) {
      scale_idx[k] = _mm512_mask_blend_epi32(__mmask16(0xff00), _mm512_set1_epi32(4 * k + 1),
                                             _mm512_set1_epi32(4 * k + 3));
    }
    __m512 acc[N];
    for (int t = 0; t < N; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* q = reinterpret_cast<const uint8_t*>(w[b].qs);
      // 2*scale+1 per group, <= 31, in the low half of each dword (high half zero).
      const __m512i sc = _mm512_srli_epi32(_mm512_loadu_si512(q), 28);
      const __m512i sc21 = _mm512_add_epi32(_mm512_add_epi32(sc, sc), _mm512_set1_epi32(1));
      // Two integer accumulators (even and odd steps) halve the vpdpwssd dependency chain.
      __m512i sumi[2][N];
      for (int t = 0; t < N; ++t) sumi[0][t] = sumi[1][t] = _mm512_setzero_si512();
      for (int k = 0; k < 4; ++k) {
        const uint8_t* g = q + 16 * k;
        const __m256i lo = _mm256_set_m128i(grid2(grid, g[2], g[3]), grid2(grid, g[0], g[1]));
        const __m256i hi = _mm256_set_m128i(grid2(grid, g[10], g[11]), grid2(grid, g[8], g[9]));
        const __m512i gv = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        const __mmask64 neg = iq2_sign_mask(load_u32(g + 4), load_u32(g + 12));
        const __m512i scv = _mm512_permutexvar_epi32(scale_idx[k], sc21);
        for (int t = 0; t < N; ++t) {
          const __m512i x = _mm512_loadu_si512(a[t][b].qs + 64 * k);
          const __m512i xs = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
          // |dot| <= 4*43*127 < 2^15, so the i32 lanes are exact i16 values and vpdpwssd
          // against the (scale, 0) word pairs applies the group scale and accumulates.
          sumi[k & 1][t] =
              _mm512_dpwssd_epi32(sumi[k & 1][t], _mm512_dpbusd_epi32(_mm512_setzero_si512(), gv, xs), scv);
        }
      }
      const float d = f16(w[b].d) * 0.125f;
      for (int t = 0; t < N; ++t) {
        acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(d * a[t][b].d),
                                 _mm512_cvtepi32_ps(_mm512_add_epi32(sumi[0][t], sumi[1][t])), acc[t]);
      }
    }
    for (int t = 0; t < N; ++t) out[t] = _mm512_reduce_add_ps(acc[t]);
  }
};

struct Mxfp4Dot {
  using Block = BlockMxfp4;
  using Act = ActQ8_0;
  static constexpr int64_t kElems = 32;
  template <int N>
  static void dot(const Block* w, const Act* const* a, int64_t nb, float* out) {
    const __m512i values =
        _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(quant::kValuesMxfp4)));
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    // 128-bit lanes: [block b low nibbles, block b high nibbles, block b+1 low, b+1 high].
    const __m512i shift = _mm512_set_epi64(4 * 0x0001000100010001ll, 4 * 0x0001000100010001ll, 0, 0,
                                           4 * 0x0001000100010001ll, 4 * 0x0001000100010001ll, 0, 0);
    __m512 acc[N];
    for (int t = 0; t < N; ++t) acc[t] = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 1 < nb; b += 2) {
      const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[b].qs));
      const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[b + 1].qs));
      const __m512i qq =
          _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(q0, q0)), _mm256_set_m128i(q1, q1), 1);
      const __m512i wv = _mm512_shuffle_epi8(values, _mm512_and_si512(_mm512_srlv_epi16(qq, shift), m4));
      const __mmask64 neg = _mm512_movepi8_mask(wv);
      const __m512i wa = _mm512_abs_epi8(wv);
      const float s0 = kMxfp4Scales.v[w[b].e], s1 = kMxfp4Scales.v[w[b + 1].e];
      for (int t = 0; t < N; ++t) {
        const __m512i x = load2x256(a[t][b].qs, a[t][b + 1].qs);
        const __m512i xs = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
        const __m512 p = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), wa, xs));
        acc[t] = _mm512_fmadd_ps(split_ps(s0 * a[t][b].d, s1 * a[t][b + 1].d), p, acc[t]);
      }
    }
    float tail[N] = {};
    if (b < nb) {
      const __m128i v128 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(quant::kValuesMxfp4));
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[b].qs));
      const __m128i lo = _mm_shuffle_epi8(v128, _mm_and_si128(q, _mm_set1_epi8(0x0f)));
      const __m128i hi = _mm_shuffle_epi8(v128, _mm_and_si128(_mm_srli_epi16(q, 4), _mm_set1_epi8(0x0f)));
      const __m256i wv = _mm256_set_m128i(hi, lo);
      const __mmask32 neg = _mm256_movepi8_mask(wv);
      const __m256i wa = _mm256_abs_epi8(wv);
      for (int t = 0; t < N; ++t) {
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[t][b].qs));
        const __m256i xs = _mm256_mask_sub_epi8(x, neg, _mm256_setzero_si256(), x);
        const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), wa, xs);
        tail[t] = kMxfp4Scales.v[w[b].e] * a[t][b].d * hsum256(_mm256_cvtepi32_ps(p));
      }
    }
    for (int t = 0; t < N; ++t) out[t] = _mm512_reduce_add_ps(acc[t]) + tail[t];
  }
};

}  // namespace

AFF_AVX512_KERNELS(q8_0_q8_0, avx512, Q8_0Dot)
AFF_AVX512_KERNELS(q4k_q8k, avx512, Q4KDot)
AFF_AVX512_KERNELS(q2k_q8k, avx512, Q2KDot)
AFF_AVX512_KERNELS(iq2xxs_q8k, avx512, Iq2XxsDot)
AFF_AVX512_KERNELS(mxfp4_q8_0, avx512, Mxfp4Dot)
AFF_AVX512_KERNELS(q3k_q8k, avx512, Q3KDot)
AFF_AVX512_KERNELS(iq4xs_q8k, avx512, Iq4XsDot)
#undef AFF_AVX512_KERNELS

}  // namespace aff::cpu::isa

#pragma GCC diagnostic pop
#pragma GCC pop_options
#else
namespace aff::cpu::isa {
AFF_UNREACHABLE_GEMV(gemv_q8_0_q8_0_avx512)
AFF_UNREACHABLE_GEMV(gemv_q4k_q8k_avx512)
AFF_UNREACHABLE_GEMV(gemv_q2k_q8k_avx512)
AFF_UNREACHABLE_GEMV(gemv_iq2xxs_q8k_avx512)
AFF_UNREACHABLE_GEMV(gemv_mxfp4_q8_0_avx512)
AFF_UNREACHABLE_GEMV(gemv_q3k_q8k_avx512)
AFF_UNREACHABLE_GEMV(gemv_iq4xs_q8k_avx512)
AFF_UNREACHABLE_GEMM(gemm_q8_0_q8_0_avx512)
AFF_UNREACHABLE_GEMM(gemm_q4k_q8k_avx512)
AFF_UNREACHABLE_GEMM(gemm_q2k_q8k_avx512)
AFF_UNREACHABLE_GEMM(gemm_iq2xxs_q8k_avx512)
AFF_UNREACHABLE_GEMM(gemm_mxfp4_q8_0_avx512)
AFF_UNREACHABLE_GEMM(gemm_q3k_q8k_avx512)
AFF_UNREACHABLE_GEMM(gemm_iq4xs_q8k_avx512)
}  // namespace aff::cpu::isa
#endif
