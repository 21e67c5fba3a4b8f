// Pieces every AVX-512 kernel translation unit shares: small vector helpers and the row
// drivers that turn a format's `dot<N>` (one weight row against N activations) into the
// GEMV and fused multi-token GEMM entry points. Include it only after the TU's
// `#pragma GCC target(...avx512...)` and <immintrin.h>: everything here is `static`
// (anonymous namespace) and so compiled for that TU's own target.
#pragma once

#include <algorithm>
#include <cstdint>

namespace aff::cpu::isa {
namespace {

inline float f16(uint16_t h) { return _cvtsh_ss(h); }

inline __m512i load2x256(const void* lo, const void* hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(static_cast<const __m256i*>(lo))),
                            _mm256_loadu_si256(static_cast<const __m256i*>(hi)), 1);
}

// Lanes 0-7 = lo, lanes 8-15 = hi.
inline __m512 split_ps(float lo, float hi) {
  return _mm512_mask_blend_ps(__mmask16(0xff00), _mm512_set1_ps(lo), _mm512_set1_ps(hi));
}

inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// A format K provides Block, Act, kElems and
//   template <int N> static void dot(const Block* w, const Act* const* a, int64_t nb, float* out)
// with out[t] = dot(row w of nb blocks, a[t]). The weight decode is done once per step and
// shared by the N tokens; each token keeps its own accumulators and the same operation
// order as N = 1, so batched results are bit-identical to the GEMV ones.

// GemvFn over `rows` rows: y[r] = dot(row r, act).
template <class K>
void gemv_rows(const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t cols, const void* act, float* y) {
  const auto* a = static_cast<const typename K::Act*>(act);
  for (int64_t r = 0; r < rows; ++r) {
    K::template dot<1>(reinterpret_cast<const typename K::Block*>(w + r * row_bytes), &a, cols / K::kElems, y + r);
  }
}

template <class K, int N>
void gemm_group(const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t nb, const typename K::Act* const* a,
                float* y, int64_t ldy) {
  for (int64_t r = 0; r < rows; ++r) {
    float o[N];
    K::template dot<N>(reinterpret_cast<const typename K::Block*>(w + r * row_bytes), a, nb, o);
    for (int t = 0; t < N; ++t) y[t * ldy + r] = o[t];
  }
}

// GemmFn: tokens in groups of four (32 ZMM registers hold four tokens' accumulators next
// to the decoded weights without spilling); the rows are expected to fit in L2, so the
// second and later groups re-read them from cache.
template <class K>
void gemm_rows(const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t cols, const void* act, int64_t act_stride,
               int64_t n, float* y, int64_t ldy) {
  using Act = typename K::Act;
  const int64_t nb = cols / K::kElems;
  const auto* base = static_cast<const uint8_t*>(act);
  for (int64_t t0 = 0; t0 < n; t0 += 4) {
    const Act* a[4];
    const int m = int(std::min<int64_t>(4, n - t0));
    for (int t = 0; t < m; ++t) a[t] = reinterpret_cast<const Act*>(base + (t0 + t) * act_stride);
    float* yt = y + t0 * ldy;
    switch (m) {
      case 4: gemm_group<K, 4>(w, row_bytes, rows, nb, a, yt, ldy); break;
      case 3: gemm_group<K, 3>(w, row_bytes, rows, nb, a, yt, ldy); break;
      case 2: gemm_group<K, 2>(w, row_bytes, rows, nb, a, yt, ldy); break;
      default: gemm_group<K, 1>(w, row_bytes, rows, nb, a, yt, ldy); break;
    }
  }
}

}  // namespace
}  // namespace aff::cpu::isa

// Defines gemv_<wname>_<isa> and gemm_<wname>_<isa> (GemvFn / GemmFn) from format K.
#define AFF_AVX512_KERNELS(wname, isa, K)                                                                      \
  void gemv_##wname##_##isa(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* a, float* y) { \
    gemv_rows<K>(w, rb, rows, cols, a, y);                                                                     \
  }                                                                                                            \
  void gemm_##wname##_##isa(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* a,            \
                            int64_t as, int64_t n, float* y, int64_t ldy) {                                    \
    gemm_rows<K>(w, rb, rows, cols, a, as, n, y, ldy);                                                         \
  }
