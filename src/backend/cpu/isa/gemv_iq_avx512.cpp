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
// The rarer codebook formats (IQ2_XS, IQ3_XXS, IQ1_S, IQ1_M) decode through gathers in
// gemv_iqgather_avx512.cpp instead (VNNI only, natural activation order).
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

// One activation as the kernel reads it per block: its kQ8KT blocks, and terms
// prepared once per call (Iq2XxsPrepBuffer) or per row (dd).
struct Iq2XxsActPrep {
  const ActQ8K* a;
  int32_t* corr;  // [nb][16]: lane 2g = -64 * (sum of group g's inputs), lane 2g+1 = 0
  float* d8;      // [nb]: the block's d / 8
  float* dd;      // [nb]: per row, d of the weight block * d8 (row_scales)
};

struct Iq2XxsDot {
  using Block = BlockIq2Xxs;
  static constexpr int64_t kElems = 256;

  // Decodes two super-blocks (q0, q1: their 64 code bytes; qword g of each: four grid
  // indices, then four 7-bit sign indices and the 4-bit scale of group g) into
  // rows[s][h]: qword g, byte j = element j's (code, sign) of rows (g, 2h), (g, 2h+1)
  // of block s (see wtab).
  static void decode_pair(__m512i q0, __m512i q1, __m512i rows[2][2]) {
    const Iq2XxsTables& T = kIq2Xxs;
    const __m512i idx2 = load64(T.idx2_ctrl);
    const __m512i idx = _mm512_permutex2var_epi8(q0, idx2, q1);
    const __mmask64 upper = _mm512_movepi8_mask(idx);
    const __m512i lo = lookup256(idx, upper, T.plane_lo), hi = lookup256(idx, upper, T.plane_hi);
    const __m512i field_ctrl = load64(T.sign_field_ctrl);
    const __m512i fields = _mm512_permutex2var_epi8(_mm512_multishift_epi64_epi8(field_ctrl, q0), idx2,
                                                    _mm512_multishift_epi64_epi8(field_ctrl, q1));
    const __m512i signs = _mm512_permutex2var_epi8(load64(T.signs), fields, load64(T.signs + 64));
    const __m512i tx = load64(T.transpose_x);
    for (int s = 0; s < 2; ++s) {
      for (int h = 0; h < 2; ++h) {
        __m512i r = _mm512_permutex2var_epi8(lo, load64(T.rows_ctrl[s][h]), hi);
        r = _mm512_mask_permutexvar_epi8(r, __mmask64(0x2424242424242424ull), load64(T.sign_ctrl[s][h]), signs);
        rows[s][h] = _mm512_gf2p8affine_epi64_epi8(tx, r, 0);
      }
    }
  }

  // One super-block's four steps from its decoded rows (q: its 64 code bytes, for the
  // scales). acc[t] += sum over the block of w * x_t, in the same order whatever N.
  template <int N>
  static void block_steps(__m512i q, const __m512i rows[2], const Iq2XxsActPrep* p, int64_t b, __m512* acc) {
    const Iq2XxsTables& T = kIq2Xxs;
    // Lanes 2g, 2g+1: 2 s_g + 1, the group's scale without d / 8 (ggml: d * (0.5 + s) / 4).
    // s_g is bits 60-63 of qword g: a shift by 59 leaves 2 s_g plus one bit of a sign
    // index, which the OR with 1 overwrites; the rotate copies it to the upper dword.
    // Shifts, rotates and ternlog avoid the shuffle port that the decode saturates.
    const __m512i s2 = _mm512_srli_epi64(q, 59);
    const __m512 scale = _mm512_cvtepi32_ps(_mm512_ternarylogic_epi64(s2, _mm512_rol_epi64(s2, 32), _mm512_set1_epi32(1), 0xfe));
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

  // dd[b] = d of weight block b * d / 8 of activation block b, for each token, before the
  // row's blocks (scalar: a gather of the sixteen d fields was slower once the row came
  // from DRAM, as it waits on every line of the row at once).
  template <int N>
  static void row_scales(const Block* w, const Iq2XxsActPrep* p, int64_t nb) {
    for (int64_t b = 0; b < nb; ++b) {
      const float d = f16(w[b].d);
      for (int t = 0; t < N; ++t) p[t].dd[b] = d * p[t].d8[b];
    }
  }

  template <int N>
  static void dot(const Block* w, const Iq2XxsActPrep* p, int64_t nb, float* out) {
    row_scales<N>(w, p, nb);
    __m512 acc[N];
    for (int t = 0; t < N; ++t) acc[t] = _mm512_setzero_ps();
    int64_t b = 0;
    // Two super-blocks per iteration: their 64 grid indices fill one register, so each
    // table permute does 64 useful lookups instead of 32.
    for (; b + 1 < nb; b += 2) {
      const __m512i q0 = load64(w[b].qs), q1 = load64(w[b + 1].qs);
      __m512i rows[2][2];
      decode_pair(q0, q1, rows);
      block_steps<N>(q0, rows[0], p, b, acc);
      block_steps<N>(q1, rows[1], p, b + 1, acc);
    }
    if (b < nb) {
      const __m512i q = load64(w[b].qs);
      __m512i rows[2][2];
      decode_pair(q, q, rows);
      block_steps<N>(q, rows[0], p, b, acc);
    }
    for (int t = 0; t < N; ++t) out[t] = _mm512_reduce_add_ps(acc[t]);
  }
};

// Per-call storage of Iq2XxsActPrep for up to four tokens (a GEMV call reads the same
// activation for every row, so its per-block terms are prepared once, not per row).
class Iq2XxsPrepBuffer {
 public:
  explicit Iq2XxsPrepBuffer(int64_t nb)
      : nb_(nb), stride_((nb + 15) / 16 * 16), corr_(size_t(4 * stride_ * 16)), f_(size_t(8 * stride_)) {}

  // Token slot t (0..3) for activation a (nb kQ8KT blocks).
  Iq2XxsActPrep prepare(int t, const ActQ8K* a) {
    Iq2XxsActPrep p{a, corr_.data() + t * stride_ * 16, f_.data() + 2 * t * stride_, f_.data() + (2 * t + 1) * stride_};
    for (int64_t b = 0; b < nb_; ++b) {
      // -64 * (sum of group g's inputs) in lane 2g (natural-order block sums: 16 inputs
      // each), 0 in lane 2g+1: both lanes of a group carry the same scale.
      const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b].bsums));
      _mm512_storeu_si512(p.corr + 16 * b, _mm512_cvtepu32_epi64(_mm256_madd_epi16(bs, _mm256_set1_epi16(-kIq2Bias))));
      p.d8[b] = a[b].d * 0.125f;
    }
    return p;
  }

 private:
  int64_t nb_, stride_;
  std::vector<int32_t> corr_;
  std::vector<float> f_;  // per token: d8, then dd
};

template <int N>
void iq2xxs_rows(const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t nb, const Iq2XxsActPrep* p, float* y,
                 int64_t ldy) {
  for (int64_t r = 0; r < rows; ++r) {
    float o[N];
    Iq2XxsDot::dot<N>(reinterpret_cast<const BlockIq2Xxs*>(w + r * row_bytes), p, nb, o);
    for (int t = 0; t < N; ++t) y[t * ldy + r] = o[t];
  }
}

}  // namespace

// The row drivers of avx512_common.h, with the activation prepared once per call.
void gemv_iq2xxs_q8kt_avx512vbmi(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* act,
                                 float* y) {
  const int64_t nb = cols / Iq2XxsDot::kElems;
  Iq2XxsPrepBuffer buf(nb);
  const Iq2XxsActPrep p = buf.prepare(0, static_cast<const ActQ8K*>(act));
  iq2xxs_rows<1>(w, rb, rows, nb, &p, y, 1);
}

// Tokens in groups of four, as gemm_rows: results bit-identical to the GEMV ones.
void gemm_iq2xxs_q8kt_avx512vbmi(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* act,
                                 int64_t act_stride, int64_t n, float* y, int64_t ldy) {
  const int64_t nb = cols / Iq2XxsDot::kElems;
  Iq2XxsPrepBuffer buf(nb);
  const auto* base = static_cast<const uint8_t*>(act);
  for (int64_t t0 = 0; t0 < n; t0 += 4) {
    Iq2XxsActPrep p[4];
    const int m = int(std::min<int64_t>(4, n - t0));
    for (int t = 0; t < m; ++t) p[t] = buf.prepare(t, reinterpret_cast<const ActQ8K*>(base + (t0 + t) * act_stride));
    float* yt = y + t0 * ldy;
    switch (m) {
      case 4: iq2xxs_rows<4>(w, rb, rows, nb, p, yt, ldy); break;
      case 3: iq2xxs_rows<3>(w, rb, rows, nb, p, yt, ldy); break;
      case 2: iq2xxs_rows<2>(w, rb, rows, nb, p, yt, ldy); break;
      default: iq2xxs_rows<1>(w, rb, rows, nb, p, yt, ldy); break;
    }
  }
}
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
