// IQ2_XXS and IQ2_XS encoders: magnitudes from an 8-wide codebook per group of 8, signs
// as 7 bits with implied even parity, 4-bit sub-block scales (per 32 for IQ2_XXS, per 16
// for IQ2_XS) under one f16 super-scale. Layouts: quant/blocks.h.
#include <cstring>

#include "quant/quantizer/iq_fit.h"
#include "quant/quantizer/iq_quantize.h"

namespace aff::quant {
namespace {

// The decoder's sub-block scale (quant/iq2.cpp), the same float expression.
float iq2_scale(float d, int code) { return d * (0.5f + float(code)) * 0.25f; }

// The search range of stage 1: the largest magnitude lands between 0.55 and 1.25 times the
// top level (43). Below ~0.6 most values fall on the lowest level; above 1.2 the largest
// ones clip hard; the least-squares refinement covers the steps between trials.
IqFitSpec iq2_spec(IqGrid grid) {
  IqFitSpec spec;
  spec.grid = &IqGridIndex::get(grid);
  spec.ratio_lo = 0.55f;
  spec.ratio_hi = 1.25f;
  spec.n_trials = 6;
  return spec;
}

// Sign-folded magnitudes t[256] and stored sign bytes signs[32] of one block.
void fold_block(const float* x, const float* w, float* t, uint8_t* signs) {
  for (int g = 0; g < kQK_K / 8; ++g) signs[g] = iq_fold_signs8(x + 8 * g, w + 8 * g, t + 8 * g);
}

// recon[8] of one group: scale * G[entry] with the stored signs, as the decoder's emit8.
void reconstruct8(const IqGridIndex& grid, float db, int entry, uint8_t signs, float* recon) {
  const float* g = grid.entry(entry);
  for (int j = 0; j < 8; ++j) {
    const float v = db * g[j];
    recon[j] = (signs >> j) & 1 ? -v : v;
  }
}

}  // namespace

void quantize_row_iq2_xxs(const float* x, BlockIq2Xxs* y, int64_t n, const float* imp, float* recon) {
  const IqFitSpec spec = iq2_spec(IqGrid::kIq2xxs);
  float w[kQK_K], t[kQK_K];
  uint8_t signs[kQK_K / 8];
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float* xb = x + b * kQK_K;
    iq_block_weights(imp ? imp + b * kQK_K : nullptr, kQK_K, w);
    fold_block(xb, w, t, signs);
    IqSubBlockFit fits[8];
    for (int ib = 0; ib < 8; ++ib) fits[ib] = iq_fit_sub_block(spec, t + 32 * ib, w + 32 * ib, 32);
    const IqQuantizedScales q = iq_quantize_scales(spec, t, w, 32, 8, fits, 15, iq2_scale);

    std::memset(&y[b], 0, sizeof(BlockIq2Xxs));
    y[b].d = q.d_bits;
    for (int ib = 0; ib < 8; ++ib) {
      // Per 32 values two u32 words: four 8-bit entries; four 7-bit sign indices and the
      // 4-bit scale code in the top bits.
      uint32_t grid_word = 0, sign_word = uint32_t(q.code[ib]) << 28;
      for (int l = 0; l < 4; ++l) {
        grid_word |= uint32_t(q.fit[ib].entry[l]) << (8 * l);
        sign_word |= uint32_t(signs[4 * ib + l] & 127) << (7 * l);
      }
      std::memcpy(y[b].qs + 4 * ib, &grid_word, 4);
      std::memcpy(y[b].qs + 4 * ib + 2, &sign_word, 4);
      if (recon) {
        const float db = iq2_scale(q.d, q.code[ib]);
        for (int l = 0; l < 4; ++l) {
          reconstruct8(*spec.grid, db, q.fit[ib].entry[l], signs[4 * ib + l], recon + b * kQK_K + 32 * ib + 8 * l);
        }
      }
    }
  }
}

void quantize_row_iq2_xs(const float* x, BlockIq2Xs* y, int64_t n, const float* imp, float* recon) {
  const IqFitSpec spec = iq2_spec(IqGrid::kIq2xs);
  float w[kQK_K], t[kQK_K];
  uint8_t signs[kQK_K / 8];
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float* xb = x + b * kQK_K;
    iq_block_weights(imp ? imp + b * kQK_K : nullptr, kQK_K, w);
    fold_block(xb, w, t, signs);
    // Sub-blocks of 16 (two groups of 8), each with its own scale code.
    IqSubBlockFit fits[16];
    for (int is = 0; is < 16; ++is) fits[is] = iq_fit_sub_block(spec, t + 16 * is, w + 16 * is, 16);
    const IqQuantizedScales q = iq_quantize_scales(spec, t, w, 16, 16, fits, 15, iq2_scale);

    std::memset(&y[b], 0, sizeof(BlockIq2Xs));
    y[b].d = q.d_bits;
    for (int ib = 0; ib < 8; ++ib) y[b].scales[ib] = uint8_t(q.code[2 * ib] | (q.code[2 * ib + 1] << 4));
    for (int g = 0; g < kQK_K / 8; ++g) {
      // Group g belongs to sub-block g/2, where it is group g%2.
      const int entry = q.fit[g / 2].entry[g % 2];
      y[b].qs[g] = uint16_t(entry | ((signs[g] & 127) << 9));
      if (recon) reconstruct8(*spec.grid, iq2_scale(q.d, q.code[g / 2]), entry, signs[g], recon + b * kQK_K + 8 * g);
    }
  }
}

}  // namespace aff::quant
