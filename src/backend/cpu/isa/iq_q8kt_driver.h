// Row drivers shared by the AVX-512 codebook kernels that take kQ8KT activations
// (gemv_iq_avx512.cpp, gemv_iq1_avx512vbmi.cpp): the activation terms a format needs per
// block (bias corrections, d times the format's scale unit) are prepared once per call
// and per token, then every row is one call of the format's
//   template <int N> static void dot_row(const Block* w, const IqActPrep* p, int64_t nb,
//                                        float* out)
// against up to four tokens. Include it only after the TU's `#pragma GCC target(...)`
// and <immintrin.h>, like avx512_common.h: everything here is compiled for that target.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "backend/cpu/act_quant.h"

namespace aff::cpu::isa {
namespace {

// One activation as the kernels read it per block: its kQ8KT blocks, and terms prepared
// once per call (IqPrepBuffer) or per row (dd).
struct IqActPrep {
  const ActQ8K* a;
  // [nb][kCorr][16]: what the step accumulators start from to cancel the +64 bias of the
  // weights, -64 * (sum of the inputs they cover) (see the formats' prepare_corr).
  int32_t* corr;
  float* d8;  // [nb]: the block's d times the format's scale unit (K::kDScale)
  float* dd;  // [nb]: per row, d of the weight block * d8 (row_scales)
};

// d of weight block b * d / 8 of activation block b, for each token, before the row's
// blocks (scalar: a gather of the sixteen d fields was slower once the row came from
// DRAM, as it waits on every line of the row at once). Block: d (f16) first.
template <int N, class Block>
void row_scales(const Block* w, const IqActPrep* p, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b) {
    const float d = f16(w[b].d);
    for (int t = 0; t < N; ++t) p[t].dd[b] = d * p[t].d8[b];
  }
}

// The sixteen block sums (natural order, 16 inputs each) sign-extended: lane i = bsums[i].
inline __m512i block_sums(const ActQ8K& a) {
  return _mm512_cvtepi16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.bsums)));
}

// Per-call storage of IqActPrep for up to `slots` (<= 4) tokens (a GEMV call reads the
// same activation for every row, so its per-block terms are prepared once, not per row).
// The MoE lane calls the kernels on 32-row chunks, so the usual sizes live on the stack.
template <class K>
class IqPrepBuffer {
 public:
  IqPrepBuffer(int64_t nb, int slots) : nb_(nb) {
    const size_t corr = size_t(slots * nb * 16 * K::kCorr), f = size_t(2 * slots * nb);
    if (corr <= kSmallCorr && f <= kSmallF) {
      corr_ = small_corr_, f_ = small_f_;
    } else {
      heap_corr_.resize(corr), heap_f_.resize(f);
      corr_ = heap_corr_.data(), f_ = heap_f_.data();
    }
  }
  IqPrepBuffer(const IqPrepBuffer&) = delete;
  IqPrepBuffer& operator=(const IqPrepBuffer&) = delete;

  // Token slot t for activation a (nb kQ8KT blocks).
  IqActPrep prepare(int t, const ActQ8K* a) {
    const int64_t cs = 16 * K::kCorr;
    IqActPrep p{a, corr_ + t * nb_ * cs, f_ + 2 * t * nb_, f_ + (2 * t + 1) * nb_};
    for (int64_t b = 0; b < nb_; ++b) {
      K::prepare_corr(a[b], p.corr + cs * b);
      p.d8[b] = a[b].d * K::kDScale;
    }
    return p;
  }

 private:
  static constexpr size_t kSmallCorr = 2048, kSmallF = 256;  // 8 KiB + 1 KiB
  int64_t nb_;
  int32_t* corr_;
  float* f_;  // per token: d8, then dd
  alignas(64) int32_t small_corr_[kSmallCorr];
  float small_f_[kSmallF];
  std::vector<int32_t> heap_corr_;
  std::vector<float> heap_f_;
};

template <class K, int N>
void iq_rows(const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t nb, const IqActPrep* p, float* y,
             int64_t ldy) {
  for (int64_t r = 0; r < rows; ++r) {
    float o[N];
    K::template dot_row<N>(reinterpret_cast<const typename K::Block*>(w + r * row_bytes), p, nb, o);
    for (int t = 0; t < N; ++t) y[t * ldy + r] = o[t];
  }
}

// The row drivers of avx512_common.h, with the activation prepared once per call.
template <class K>
void iq_gemv(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* act, float* y) {
  const int64_t nb = cols / K::kElems;
  IqPrepBuffer<K> buf(nb, 1);
  const IqActPrep p = buf.prepare(0, static_cast<const ActQ8K*>(act));
  iq_rows<K, 1>(w, rb, rows, nb, &p, y, 1);
}

// Tokens in groups of four, as gemm_rows: results bit-identical to the GEMV ones.
template <class K>
void iq_gemm(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* act, int64_t act_stride,
             int64_t n, float* y, int64_t ldy) {
  const int64_t nb = cols / K::kElems;
  IqPrepBuffer<K> buf(nb, int(std::min<int64_t>(4, n)));
  const auto* base = static_cast<const uint8_t*>(act);
  for (int64_t t0 = 0; t0 < n; t0 += 4) {
    IqActPrep p[4];
    const int m = int(std::min<int64_t>(4, n - t0));
    for (int t = 0; t < m; ++t) p[t] = buf.prepare(t, reinterpret_cast<const ActQ8K*>(base + (t0 + t) * act_stride));
    float* yt = y + t0 * ldy;
    switch (m) {
      case 4: iq_rows<K, 4>(w, rb, rows, nb, p, yt, ldy); break;
      case 3: iq_rows<K, 3>(w, rb, rows, nb, p, yt, ldy); break;
      case 2: iq_rows<K, 2>(w, rb, rows, nb, p, yt, ldy); break;
      default: iq_rows<K, 1>(w, rb, rows, nb, p, yt, ldy); break;
    }
  }
}

}  // namespace
}  // namespace aff::cpu::isa
