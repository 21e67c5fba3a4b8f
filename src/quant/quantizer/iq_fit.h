// Shared search of the i-quant encoders: fit a sub-block of values as
//   x[i] ≈ scale * (G[e][i] + offset)
// where G[e] is a codebook entry (IqGridIndex) chosen per group of dims() values, scale
// is per sub-block, and offset is 0 (IQ2/IQ3: magnitudes with separate signs) or ±delta
// (IQ1: ternary entries shifted by ±1/8). Everything minimises the weighted squared error
// sum w[i] * (x[i] - reconstruction[i])^2.
//
// Three stages, each format chaining them:
//   1. iq_fit_sub_block: unconstrained scale. Several trial scales each give the best
//      entries for that scale, the least-squares scale for those entries, and the trial
//      with the least error is refined by alternating the two until it settles.
//   2. iq_quantize_scales: the sub-block scales become small integer codes times one f16
//      super-scale d. Several d are tried; for each, every sub-block tries the codes next
//      to its ideal and re-picks its entries at the exact decoded scale.
//   3. The format packs entries, codes and d, and (optionally) writes the values the
//      blocks decode to, computed with the decoder's own float expressions.
#pragma once

#include <cstdint>

#include "quant/quantizer/iq_grid_index.h"

namespace aff::quant {

// How a sub-block's offset is chosen.
enum class IqOffset {
  kNone,         // offset 0 (IQ2_XXS, IQ2_XS, IQ3_XXS)
  kPerSubBlock,  // one sign of ±delta for the whole sub-block (IQ1_S)
  kPerGroup,     // a sign of ±delta per group of dims() values (IQ1_M)
};

struct IqFitSpec {
  const IqGridIndex* grid = nullptr;
  IqOffset offset = IqOffset::kNone;
  float delta = 0.0f;  // |offset| for the ±delta modes
  // Trial scales put the largest |x| of a sub-block at ratio * top_level, for ratios
  // spread evenly over [ratio_lo, ratio_hi] (n_trials of them). Few suffice: stage 1 hands
  // stage 2 only its scale, which stage 2 rounds to a code and searches the codes next to,
  // so a finer sweep here moves the final error by less than 0.01% (docs/BENCHMARKS.md,
  // i-quant encoder speed), at a cost linear in n_trials.
  float ratio_lo = 0.6f;
  float ratio_hi = 1.3f;
  int n_trials = 6;
};

inline constexpr int kIqMaxGroups = 8;  // groups per sub-block: 32 values / 4 (IQ3_XXS)

// One sub-block's entries at some scale.
struct IqSubBlockFit {
  float scale = 0.0f;               // >= 0; 0 only for a sub-block that is all zero
  double err = 0.0;                 // sum w (x - scale * (G + offset))^2
  uint16_t entry[kIqMaxGroups] = {};
  bool neg_offset[kIqMaxGroups] = {};  // offset is -delta (IQ1 modes; all equal for kPerSubBlock)
};

// Best entries for x[len] at a fixed scale (> 0); the error is exact for that scale.
// x, w: [len], len a multiple of dims() and at most kIqMaxGroups groups.
IqSubBlockFit iq_assign_at_scale(const IqFitSpec& spec, const float* x, const float* w, int len, float scale);

// Stage 1: scale and entries with the least weighted error. x, w: [len].
IqSubBlockFit iq_fit_sub_block(const IqFitSpec& spec, const float* x, const float* w, int len);

// Stage 2. The decoder's sub-block scale for super-scale d and code c, bit for bit
// (e.g. d * (0.5f + float(c)) * 0.25f for IQ2_XXS); increasing in c for d > 0.
using IqScaleFn = float (*)(float d, int code);

struct IqQuantizedScales {
  uint16_t d_bits = 0;    // f16 super-scale as stored
  float d = 0.0f;         // its value
  int code[16] = {};      // per sub-block, 0..max_code
  IqSubBlockFit fit[16];  // entries re-picked at the decoded scale of each code
};

// fits: [n_sub] stage-1 results of the sub-blocks x[n_sub * sub_len] (weights w likewise).
// With d = 0 (every sub-block all zero), codes are 0 and entries are those nearest zero.
IqQuantizedScales iq_quantize_scales(const IqFitSpec& spec, const float* x, const float* w, int sub_len, int n_sub,
                                     const IqSubBlockFit* fits, int max_code, IqScaleFn scale_of);

// Sign folding for the formats that store 8 signs as 7 bits of even parity: t[j] = |x[j]|,
// except that when an odd number of x[0..8) are negative, the element whose misfit costs
// least (smallest w*x²) keeps the wrong sign (t = -|x|), which the fit then handles as a
// value below the smallest magnitude. Returns the 8 stored sign bits (bit j = negative).
uint8_t iq_fold_signs8(const float* x, const float* w, float* t);

// Per-element weights for one super-block of n values: the importance values, or 1 when
// there are none. Importance 0 (a column no calibration token reached) would leave the
// value unconstrained, so every weight gets a floor of 1e-3 × the super-block's mean
// importance; an all-zero importance block falls back to uniform weights. w: [n].
void iq_block_weights(const float* imp, int n, float* w);

}  // namespace aff::quant
