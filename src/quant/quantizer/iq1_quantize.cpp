// IQ1_S and IQ1_M encoders: ternary codebook entries per group of 8 shifted by ±1/8, odd
// 3-bit sub-scales (2s+1) under one f16 super-scale. IQ1_S: one scale and one shift sign
// per 32; IQ1_M: a scale per 16 and a shift sign per 8. Layouts: quant/blocks.h.
#include <cstring>

#include "quant/quantizer/iq_fit.h"
#include "quant/quantizer/iq_quantize.h"

namespace aff::quant {
namespace {

// The decoder's sub-block scale (quant/iq1.cpp), the same float expression.
float iq1_scale(float d, int code) { return d * float(2 * code + 1); }

// Ternary entries put values at 0 or ±(1 ± 1/8) scales, so for bell-shaped data the best
// scale sits near the mean magnitude of the non-zero values, well below the largest
// value: trials put the largest |x| anywhere from 0.8 to 3.2 scales out.
IqFitSpec iq1_spec(IqOffset offset) {
  IqFitSpec spec;
  spec.grid = &IqGridIndex::get(IqGrid::kIq1s);
  spec.offset = offset;
  spec.delta = kIq1Delta;
  spec.ratio_lo = 0.8f;
  spec.ratio_hi = 3.2f;
  spec.n_trials = 12;
  return spec;
}

// recon[8] of one group as the decoder's emit8: dl * (G + delta).
void reconstruct8(const IqGridIndex& grid, float dl, int entry, bool neg_delta, float* recon) {
  const float delta = neg_delta ? -kIq1Delta : kIq1Delta;
  const float* g = grid.entry(entry);
  for (int j = 0; j < 8; ++j) recon[j] = dl * (g[j] + delta);
}

}  // namespace

void quantize_row_iq1_s(const float* x, BlockIq1S* y, int64_t n, const float* imp, float* recon) {
  const IqFitSpec spec = iq1_spec(IqOffset::kPerSubBlock);
  float w[kQK_K];
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float* xb = x + b * kQK_K;
    iq_block_weights(imp ? imp + b * kQK_K : nullptr, kQK_K, w);
    IqSubBlockFit fits[8];
    for (int ib = 0; ib < 8; ++ib) fits[ib] = iq_fit_sub_block(spec, xb + 32 * ib, w + 32 * ib, 32);
    const IqQuantizedScales q = iq_quantize_scales(spec, xb, w, 32, 8, fits, 7, iq1_scale);

    std::memset(&y[b], 0, sizeof(BlockIq1S));
    y[b].d = q.d_bits;
    for (int ib = 0; ib < 8; ++ib) {
      // Per 32 values: four low index bytes; a u16 of four 3-bit high index parts, the
      // 3-bit scale code (bits 12..14) and the shift sign (bit 15, set = -1/8).
      const IqSubBlockFit& f = q.fit[ib];
      uint16_t qh = uint16_t((q.code[ib] << 12) | (f.neg_offset[0] ? 0x8000 : 0));
      for (int l = 0; l < 4; ++l) {
        y[b].qs[4 * ib + l] = uint8_t(f.entry[l] & 0xff);
        qh = uint16_t(qh | ((f.entry[l] >> 8) << (3 * l)));
      }
      y[b].qh[ib] = qh;
      if (recon) {
        const float dl = iq1_scale(q.d, q.code[ib]);
        for (int l = 0; l < 4; ++l) {
          reconstruct8(*spec.grid, dl, f.entry[l], f.neg_offset[0], recon + b * kQK_K + 32 * ib + 8 * l);
        }
      }
    }
  }
}

void quantize_row_iq1_m(const float* x, BlockIq1M* y, int64_t n, const float* imp, float* recon) {
  const IqFitSpec spec = iq1_spec(IqOffset::kPerGroup);
  float w[kQK_K];
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float* xb = x + b * kQK_K;
    iq_block_weights(imp ? imp + b * kQK_K : nullptr, kQK_K, w);
    IqSubBlockFit fits[16];
    for (int is = 0; is < 16; ++is) fits[is] = iq_fit_sub_block(spec, xb + 16 * is, w + 16 * is, 16);
    const IqQuantizedScales q = iq_quantize_scales(spec, xb, w, 16, 16, fits, 7, iq1_scale);

    std::memset(&y[b], 0, sizeof(BlockIq1M));
    // Four u16 scale words: word k holds the 3-bit codes of sub-blocks 4k..4k+3 at bits
    // 0, 3, 6, 9 and nibble k of the f16 super-scale in bits 12..15.
    uint16_t words[4];
    for (int k = 0; k < 4; ++k) {
      words[k] = uint16_t(((q.d_bits >> (4 * k)) & 0x0f) << 12);
      for (int s = 0; s < 4; ++s) words[k] = uint16_t(words[k] | (q.code[4 * k + s] << (3 * s)));
    }
    std::memcpy(y[b].scales, words, sizeof(words));
    for (int g = 0; g < kQK_K / 8; ++g) {
      // Group g is group g%2 of sub-block g/2. qh byte per two groups: a nibble each of
      // 3 high index bits and the shift sign (bit 3, set = -1/8).
      const IqSubBlockFit& f = q.fit[g / 2];
      const int entry = f.entry[g % 2];
      const bool neg = f.neg_offset[g % 2];
      y[b].qs[g] = uint8_t(entry & 0xff);
      y[b].qh[g / 2] = uint8_t(y[b].qh[g / 2] | (((entry >> 8) | (neg ? 8 : 0)) << (4 * (g % 2))));
      if (recon) reconstruct8(*spec.grid, iq1_scale(q.d, q.code[g / 2]), entry, neg, recon + b * kQK_K + 8 * g);
    }
  }
}

}  // namespace aff::quant
