// IQ3_XXS encoder: magnitudes from a 4-wide codebook (two entries per group of 8), signs as
// 7 bits with implied even parity per group of 8, a 4-bit scale per 32 under one f16
// super-scale. Layout: quant/blocks.h.
#include <cstring>

#include "quant/quantizer/iq_fit.h"
#include "quant/quantizer/iq_quantize.h"

namespace aff::quant {
namespace {

// The decoder's sub-block scale (quant/iq3.cpp), the same float expression.
float iq3_scale(float d, int code) { return d * (0.5f + float(code)) * 0.5f; }

}  // namespace

void quantize_row_iq3_xxs(const float* x, BlockIq3Xxs* y, int64_t n, const float* imp, float* recon) {
  // Eight levels (4..62) give the search a finer lattice than IQ2's three, so a narrower
  // range of trial scales around "largest magnitude at the top level" suffices.
  IqFitSpec spec;
  spec.grid = &IqGridIndex::get(IqGrid::kIq3xxs);
  spec.ratio_lo = 0.6f;
  spec.ratio_hi = 1.2f;
  spec.n_trials = 6;
  float w[kQK_K], t[kQK_K];
  uint8_t signs[kQK_K / 8];
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float* xb = x + b * kQK_K;
    iq_block_weights(imp ? imp + b * kQK_K : nullptr, kQK_K, w);
    for (int g = 0; g < kQK_K / 8; ++g) signs[g] = iq_fold_signs8(xb + 8 * g, w + 8 * g, t + 8 * g);
    IqSubBlockFit fits[8];
    for (int ib = 0; ib < 8; ++ib) fits[ib] = iq_fit_sub_block(spec, t + 32 * ib, w + 32 * ib, 32);
    const IqQuantizedScales q = iq_quantize_scales(spec, t, w, 32, 8, fits, 15, iq3_scale);

    std::memset(&y[b], 0, sizeof(BlockIq3Xxs));
    y[b].d = q.d_bits;
    for (int ib = 0; ib < 8; ++ib) {
      // 64 entry bytes first (entry k of sub-block ib covers values 32*ib + 4k ..+3), then
      // per 32 values a u32 of four 7-bit sign indices and the 4-bit scale code on top.
      uint32_t sign_word = uint32_t(q.code[ib]) << 28;
      for (int k = 0; k < 8; ++k) y[b].qs[8 * ib + k] = uint8_t(q.fit[ib].entry[k]);
      for (int l = 0; l < 4; ++l) sign_word |= uint32_t(signs[4 * ib + l] & 127) << (7 * l);
      std::memcpy(y[b].qs + kQK_K / 4 + 4 * ib, &sign_word, 4);
      if (recon) {
        const float db = iq3_scale(q.d, q.code[ib]);
        for (int j = 0; j < 32; ++j) {
          const float v = db * spec.grid->entry(q.fit[ib].entry[j / 4])[j % 4];
          recon[b * kQK_K + 32 * ib + j] = (signs[4 * ib + j / 8] >> (j % 8)) & 1 ? -v : v;
        }
      }
    }
  }
}

}  // namespace aff::quant
