// AVX-512 VBMI kernels for IQ1_S and IQ1_M against activations in transposed-group order
// (ActFormat::kQ8KT: 64-byte step k holds row k of each of the eight 32-input groups, so
// group g's scale sits in lanes 2g, 2g+1 of every step and is applied once per
// super-block, as in the IQ2/IQ3 kernels of gemv_iq_avx512.cpp).
//
// The IQ1 grid has 2048 rows of eight values in {-1, 0, 1}. Its code planes would take
// 4 KiB of permute tables, twice the whole ZMM register file, and a 2048-entry byte
// lookup costs sixteen vpermi2b and fifteen blends per plane for 64 rows, i.e. more
// shuffle-port work per weight than the whole IQ2_XXS kernel. So here the grid row is
// fetched ready to use: one vpgatherdq per 64-weight step reads eight rows of a 32 KiB
// constexpr table of the weights as vpdpbusd's unsigned operand, 64 + 8 g ± 1 (IQ1's
// g ± 1/8 kept as 8 g ± 1 with d / 8; the table's second half holds the - 1 rows). The
// gathers run on the load ports; what stays on the shuffle port per super-block is the
// index assembly (two vpermb, two vpmultishiftqb, a vpermq and two extracts for 32 rows),
// the scale extraction and nothing per step but the dot itself:
//   - index of row (g, k): its low byte from qs[4g + k] (vpermb into the dword that the
//     gather reads for step k, lane g), its high bits (IQ1_S: 3 bits of qh[g]; IQ1_M: the
//     qh nibble, whose bit 3 is the row's delta sign and so selects the table half) by
//     vpmultishiftqb, merged by one vpternlogd;
//   - the +64 bias comes back through the accumulator's start value, -64 x (sum of the
//     group's inputs) from the activation's block sums, prepared once per call; IQ1_S's
//     delta sign is per group of 32, so its rows all come from the + half and a negative
//     delta starts the group from -66 x the sum instead (one blend per block);
//   - the group scales (2s + 1) by one vpermw of the scale words into lanes 2g, 2g + 1,
//     a shift or rotate and a vpternlogd, then d (2s + 1) / 8 in f32 once per block.
#include <cstdint>
#include <cstring>

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

constexpr int kIq1Bias = 64;

// constexpr, so no static initialiser compiled for this TU's ISA runs at start-up.
struct Iq1Tables {
  // rows[s][i]: grid row i as eight bytes 64 + 8 g + 1 (s = 0) or 64 + 8 g - 1 (s = 1),
  // read as one qword per row by the gathers (index = i + 2048 s).
  uint64_t rows[2][2048] = {};
  // Index assembly for steps 2h, 2h + 1 (dword m of the result: row (g = m % 8,
  // k = 2h + m / 8), the lane order vpgatherdq reads for step k):
  //   lo_ctrl[h]: byte 4m <- qs byte 4g + k of the 64 bytes loaded from qs;
  //   hi_ctrl_s / hi_ctrl_m [h]: byte 4m + 1 <- the 8-bit window that starts at the row's
  //   high index bits within the qh qword holding group g (qh_qwords puts it in the same
  //   qword as dword m).
  uint8_t lo_ctrl[2][64] = {};
  uint8_t hi_ctrl_s[2][64] = {};
  uint8_t hi_ctrl_m[2][64] = {};
  // vpermw: word 2m (low word of dword m, lanes 2g and 2g + 1 for g = m / 2) <- the
  // IQ1_S qh word of group g (word 16 + g of the load) / the IQ1_M scale word g / 2
  // (word 24 + g / 2).
  uint16_t qh_words[32] = {};
  uint16_t scale_words[32] = {};
  // IQ1_M rotate counts per dword: sub-scale of group g for steps 2e, 2e + 1 sits at bit
  // 6 (g % 2) + 3 e of the word; rotating left by 1 - that (mod 32) puts it at bits 1-3.
  uint32_t scale_rot[2][16] = {};

  constexpr Iq1Tables() {
    for (int i = 0; i < 2048; ++i) {
      for (int j = 0; j < 8; ++j) {
        const int g = int(int8_t(uint8_t(quant::kIq1sGrid[i] >> (8 * j))));
        rows[0][i] |= uint64_t(uint8_t(kIq1Bias + 8 * g + 1)) << (8 * j);
        rows[1][i] |= uint64_t(uint8_t(kIq1Bias + 8 * g - 1)) << (8 * j);
      }
    }
    for (int h = 0; h < 2; ++h) {
      for (int m = 0; m < 16; ++m) {
        const int g = m % 8, k = 2 * h + m / 8;
        lo_ctrl[h][4 * m] = uint8_t(4 * g + k);
        hi_ctrl_s[h][4 * m + 1] = uint8_t(16 * (g % 4) + 3 * k);
        hi_ctrl_m[h][4 * m + 1] = uint8_t(16 * (g % 4) + 8 * (k / 2) + 4 * (k % 2));
      }
    }
    for (int m = 0; m < 16; ++m) {
      qh_words[2 * m] = uint16_t(16 + m / 2);
      scale_words[2 * m] = uint16_t(24 + m / 4);
      for (int e = 0; e < 2; ++e) scale_rot[e][m] = uint32_t((1 - (6 * ((m / 2) % 2) + 3 * e)) & 31);
    }
  }
};
constexpr Iq1Tables kIq1{};

inline __m512i load64(const void* p) { return _mm512_loadu_si512(p); }

// The weight rows of a block's four steps (wv[k]: row (g, k) in qword g): blk = its 64
// bytes from qs (qs in bytes 0-31, qh in bytes 32-47 for both formats), qh = qh_qwords
// (blk), hi_mask = the dword bits that carry the high index (IQ1_S: 8-10; IQ1_M: 8-11,
// bit 11 the delta sign).
inline void gather_rows(__m512i blk, __m512i qh, const uint8_t (*hi_ctrl)[64], __m512i hi_mask, __m512i wv[4]) {
  const auto* table = reinterpret_cast<const long long*>(kIq1.rows);
  for (int h = 0; h < 2; ++h) {
    const __m512i lo = _mm512_maskz_permutexvar_epi8(__mmask64(0x1111111111111111ull), load64(kIq1.lo_ctrl[h]), blk);
    const __m512i hi = _mm512_multishift_epi64_epi8(load64(hi_ctrl[h]), qh);
    const __m512i idx = _mm512_ternarylogic_epi32(hi, hi_mask, lo, 0xea);  // (hi & mask) | lo
    wv[2 * h] = _mm512_i32gather_epi64(_mm512_castsi512_si256(idx), table, 8);
    wv[2 * h + 1] = _mm512_i32gather_epi64(_mm512_extracti64x4_epi64(idx, 1), table, 8);
  }
}

// Qwords 4 and 5 of a block's 64 bytes from qs (qh of groups 0-3 and 4-7) where the
// multishift windows read them: qword q (dwords 2q, 2q + 1: groups 2q % 8 and the next)
// gets the one holding those groups.
inline __m512i qh_qwords(__m512i blk) { return _mm512_permutexvar_epi64(_mm512_set_epi64(5, 5, 4, 4, 5, 5, 4, 4), blk); }

// f32 (2s + 1) from dwords whose bits 1-3 hold s (bit 0 and bits 4 and up: other fields).
inline __m512 odd_scale_ps(__m512i s2) {
  return _mm512_cvtepi32_ps(_mm512_ternarylogic_epi32(s2, _mm512_set1_epi32(0xe), _mm512_set1_epi32(1), 0xea));
}

// The 64 bytes from qs of a block whose qs, qh (and scales) end `used` bytes later; the
// rest is masked so that the last block of a buffer reads nothing past it.
inline __m512i load_block(const uint8_t* qs, int used) {
  return _mm512_maskz_loadu_epi8(__mmask64((uint64_t(1) << used) - 1), qs);
}

// IQ1_S: per group of 32 four low index bytes in qs, and a u16 qh with the four 3-bit
// high parts (bits 3k..3k+2 for row k), the 3-bit scale (12-14) and the delta sign (15).
struct Iq1SFormat {
  using Block = quant::BlockIq1S;
  static constexpr int64_t kElems = 256;
  static constexpr int kCorr = 2;
  static constexpr float kDScale = 0.125f;  // weight = d (2s + 1) / 8 * (8 g ± 1)
  static constexpr int kUsed = 48;          // bytes from qs: qs, qh
  static constexpr int kHiMask = 0x700;     // index bits 8-10 from qh
  static constexpr const uint8_t (*hi_ctrl())[64] { return kIq1.hi_ctrl_s; }

  // Lane 2g: -64 (positive delta: the table's + rows as they are) and -66 (negative
  // delta: 8 g - 1 = table - 2) times the sum of group g's 32 inputs; lane 2g + 1: 0.
  static void prepare_corr(const ActQ8K& a, int32_t* corr) {
    const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.bsums));
    _mm512_storeu_si512(corr, _mm512_cvtepu32_epi64(_mm256_madd_epi16(bs, _mm256_set1_epi16(-kIq1Bias))));
    _mm512_storeu_si512(corr + 16, _mm512_cvtepu32_epi64(_mm256_madd_epi16(bs, _mm256_set1_epi16(-kIq1Bias - 2))));
  }

  template <int N>
  static void row_prologue(const Block* w, const IqActPrep* p, int64_t nb) {
    row_scales<N>(w, p, nb);
  }

  // The block's four steps from its gathered rows wv (blk: its 64 bytes from qs).
  template <int N>
  [[gnu::always_inline]] static void steps(const Block& w, __m512i blk, const __m512i wv[4], const IqActPrep* p,
                                           int64_t b, __m512* acc) {
    // Lanes 2g, 2g + 1: qh[g]; shifted down by 11, bits 1-3 are the scale.
    const __m512i qhw = _mm512_maskz_permutexvar_epi16(0x55555555u, load64(kIq1.qh_words), blk);
    const __m512 scale = odd_scale_ps(_mm512_srli_epi32(qhw, 11));
    const __mmask8 neg = _mm_movepi16_mask(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.qh)));
    __m512i sumi[N];
    for (int t = 0; t < N; ++t) {
      sumi[t] = _mm512_mask_blend_epi64(neg, load64(p[t].corr + 32 * b), load64(p[t].corr + 32 * b + 16));
    }
    for (int k = 0; k < 4; ++k) {
      // |sum| <= 16*73*127 + 66*32*127 < 2^31.
      for (int t = 0; t < N; ++t) sumi[t] = _mm512_dpbusd_epi32(sumi[t], wv[k], load64(p[t].a[b].qs + 64 * k));
    }
    for (int t = 0; t < N; ++t) {
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[t]), _mm512_mul_ps(scale, _mm512_set1_ps(p[t].dd[b])), acc[t]);
    }
  }
};

// IQ1_M: qs as IQ1_S; a qh byte per 16 inputs, nibble k % 2 of byte 2g + k / 2 for row
// (g, k): 3 high index bits and the row's delta sign (bit 3); four u16 scale words with
// two 3-bit sub-scales per group (word g / 2, bits 6 (g % 2) for rows 0-1 and + 3 for
// rows 2-3) whose top nibbles form the f16 d. Two accumulators per block, one per
// sub-scale (steps 0-1 and 2-3). The delta sign picks the table half (32 KiB in all): a
// variant on the + half alone, correcting negative-delta rows by their input sums (three
// more operations per block), measured 3-4% slower on the GPU host.
struct Iq1MFormat {
  using Block = quant::BlockIq1M;
  static constexpr int64_t kElems = 256;
  static constexpr int kCorr = 2;
  static constexpr float kDScale = 0.125f;
  static constexpr int kUsed = 56;       // bytes from qs: qs, qh, scales
  static constexpr int kHiMask = 0xf00;  // index bits 8-11 from the qh nibble, 11 = delta sign
  static constexpr const uint8_t (*hi_ctrl())[64] { return kIq1.hi_ctrl_m; }

  // For steps 0-1 and 2-3: -64 * bsums[2g] and -64 * bsums[2g + 1] in lane 2g, 0 in lane
  // 2g + 1 (the delta is in the table row, so the bias is all that needs cancelling).
  static void prepare_corr(const ActQ8K& a, int32_t* corr) {
    const __m512i bs = _mm512_mullo_epi32(block_sums(a), _mm512_set1_epi32(-kIq1Bias));
    _mm512_storeu_si512(corr, _mm512_maskz_mov_epi32(__mmask16(0x5555), bs));
    _mm512_storeu_si512(corr + 16, _mm512_srli_epi64(bs, 32));
  }

  static float block_d(const Block& b) {
    uint16_t sc[4];
    std::memcpy(sc, b.scales, sizeof(sc));
    return f16(uint16_t((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000)));
  }

  template <int N>
  static void row_prologue(const Block* w, const IqActPrep* p, int64_t nb) {
    for (int64_t b = 0; b < nb; ++b) {
      const float d = block_d(w[b]);
      for (int t = 0; t < N; ++t) p[t].dd[b] = d * p[t].d8[b];
    }
  }

  template <int N>
  [[gnu::always_inline]] static void steps(const Block&, __m512i blk, const __m512i wv[4], const IqActPrep* p,
                                           int64_t b, __m512* acc) {
    const __m512i scw = _mm512_maskz_permutexvar_epi16(0x55555555u, load64(kIq1.scale_words), blk);
    __m512 scale[2];
    for (int e = 0; e < 2; ++e) scale[e] = odd_scale_ps(_mm512_rolv_epi32(scw, load64(kIq1.scale_rot[e])));
    __m512i sumi[2][N];
    for (int e = 0; e < 2; ++e) {
      for (int t = 0; t < N; ++t) sumi[e][t] = load64(p[t].corr + 32 * b + 16 * e);
    }
    for (int k = 0; k < 4; ++k) {
      // |sum| over two steps <= 8*73*127 + 64*16*127 < 2^31.
      for (int t = 0; t < N; ++t) {
        sumi[k >> 1][t] = _mm512_dpbusd_epi32(sumi[k >> 1][t], wv[k], load64(p[t].a[b].qs + 64 * k));
      }
    }
    for (int t = 0; t < N; ++t) {
      const __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[1][t]), scale[1],
                                       _mm512_mul_ps(_mm512_cvtepi32_ps(sumi[0][t]), scale[0]));
      acc[t] = _mm512_fmadd_ps(v, _mm512_set1_ps(p[t].dd[b]), acc[t]);
    }
  }
};

// A format F as the row drivers (iq_q8kt_driver.h) call it: per block, its rows gathered
// (gather_rows), then its steps. (Two blocks per iteration, all eight gathers issued
// before the dot products, measured the same on the GPU host within its noise.)
template <class F>
struct Iq1Dot : F {
  template <int N>
  [[gnu::always_inline]] static void dot_row(const typename F::Block* w, const IqActPrep* p, int64_t nb, float* out) {
    F::template row_prologue<N>(w, p, nb);
    const __m512i hi_mask = _mm512_set1_epi32(F::kHiMask);
    __m512 acc[N];
    for (int t = 0; t < N; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const __m512i blk = load_block(w[b].qs, F::kUsed);
      __m512i wv[4];
      gather_rows(blk, qh_qwords(blk), F::hi_ctrl(), hi_mask, wv);
      F::template steps<N>(w[b], blk, wv, p, b, acc);
    }
    for (int t = 0; t < N; ++t) out[t] = _mm512_reduce_add_ps(acc[t]);
  }
};

}  // namespace

void gemv_iq1s_q8kt_avx512vbmi(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* act, float* y) {
  iq_gemv<Iq1Dot<Iq1SFormat>>(w, rb, rows, cols, act, y);
}
void gemm_iq1s_q8kt_avx512vbmi(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* act,
                               int64_t act_stride, int64_t n, float* y, int64_t ldy) {
  iq_gemm<Iq1Dot<Iq1SFormat>>(w, rb, rows, cols, act, act_stride, n, y, ldy);
}
void gemv_iq1m_q8kt_avx512vbmi(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* act, float* y) {
  iq_gemv<Iq1Dot<Iq1MFormat>>(w, rb, rows, cols, act, y);
}
void gemm_iq1m_q8kt_avx512vbmi(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* act,
                               int64_t act_stride, int64_t n, float* y, int64_t ldy) {
  iq_gemm<Iq1Dot<Iq1MFormat>>(w, rb, rows, cols, act, act_stride, n, y, ldy);
}

}  // namespace aff::cpu::isa

#pragma GCC diagnostic pop
#pragma GCC pop_options
#else
namespace aff::cpu::isa {
AFF_UNREACHABLE_GEMV(gemv_iq1s_q8kt_avx512vbmi)
AFF_UNREACHABLE_GEMV(gemv_iq1m_q8kt_avx512vbmi)
AFF_UNREACHABLE_GEMM(gemm_iq1s_q8kt_avx512vbmi)
AFF_UNREACHABLE_GEMM(gemm_iq1m_q8kt_avx512vbmi)
}  // namespace aff::cpu::isa
#endif
