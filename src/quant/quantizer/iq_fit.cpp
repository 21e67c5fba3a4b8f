#include "quant/quantizer/iq_fit.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <span>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "core/check.h"
#include "core/dtype.h"

namespace aff::quant {
namespace {

// The super-scale trials of stage 2, as factors on the d that gives the largest sub-block
// scale the top code. Smaller d clips that sub-block a little but gives every other one
// finer code steps; which wins depends on the block, so each is tried.
constexpr float kSuperScaleTrials[] = {1.0f, 0.95f, 0.9f};

// Largest finite f16, so that a huge block cannot store an infinite super-scale.
constexpr float kMaxF16 = 65504.0f;

// Weighted squared distance sum_j w[j] * (t[j] - g[j])^2 of a group of N (8 or 4) values,
// the encoder's innermost sum. It runs as four lanes: lane j sums the terms j and j + 4
// (N = 8) or holds term j (N = 4), then the lanes reduce as (0 + 2) + (1 + 3). That is a
// short dependency chain held in one SSE register, where a left-to-right sum is a chain of
// N dependent adds. The order is fixed in the source, so the scalar fallback and the SSE
// path give the same bits.
template <int N>
struct GroupDist {
  static_assert(N == 8 || N == 4);
#if defined(__SSE2__)
  __m128 t0, t1, w0, w1;
  GroupDist(const float* t, const float* w) : t0(_mm_loadu_ps(t)), w0(_mm_loadu_ps(w)) {
    if constexpr (N == 8) t1 = _mm_loadu_ps(t + 4), w1 = _mm_loadu_ps(w + 4);
  }
  __m128 lanes(const float* g) const {
    const __m128 d0 = _mm_sub_ps(t0, _mm_loadu_ps(g));
    __m128 lane = _mm_mul_ps(_mm_mul_ps(w0, d0), d0);
    if constexpr (N == 8) {
      const __m128 d1 = _mm_sub_ps(t1, _mm_loadu_ps(g + 4));
      lane = _mm_add_ps(lane, _mm_mul_ps(_mm_mul_ps(w1, d1), d1));
    }
    return lane;
  }
  float operator()(const float* g) const {
    const __m128 lane = lanes(g);
    const __m128 pair = _mm_add_ps(lane, _mm_movehl_ps(lane, lane));  // lanes 0+2, 1+3
    return _mm_cvtss_f32(_mm_add_ss(pair, _mm_shuffle_ps(pair, pair, 1)));
  }
  // Four entries' distances at once, each reduced in the same order as operator(): the
  // lane vectors transposed so that one vertical add tree serves all four.
  void four(const float* g0, const float* g1, const float* g2, const float* g3, float* out) const {
    __m128 a = lanes(g0), b = lanes(g1), c = lanes(g2), d = lanes(g3);
    _MM_TRANSPOSE4_PS(a, b, c, d);  // a = lane 0 of each entry, b = lane 1, ...
    _mm_storeu_ps(out, _mm_add_ps(_mm_add_ps(a, c), _mm_add_ps(b, d)));
  }
#else
  const float* t;
  const float* w;
  GroupDist(const float* t_, const float* w_) : t(t_), w(w_) {}
  float operator()(const float* g) const {
    float lane[4];
    for (int j = 0; j < 4; ++j) {
      const float d = t[j] - g[j];
      lane[j] = w[j] * d * d;
      if constexpr (N == 8) {
        const float d1 = t[j + 4] - g[j + 4];
        lane[j] = lane[j] + w[j + 4] * d1 * d1;
      }
    }
    return (lane[0] + lane[2]) + (lane[1] + lane[3]);
  }
  void four(const float* g0, const float* g1, const float* g2, const float* g3, float* out) const {
    out[0] = (*this)(g0), out[1] = (*this)(g1), out[2] = (*this)(g2), out[3] = (*this)(g3);
  }
#endif
};

// Entry for one group of N = grid.dims() values x, w at 1/scale = inv with a fixed offset:
// the one minimising sum w (x*inv - offset - G)^2. Returns that sum (in scaled units).
template <int N>
float best_entry(const IqGridIndex& grid, const float* x, const float* w, float inv, float offset, uint16_t* entry) {
  float t[N];
  for (int j = 0; j < N; ++j) t[j] = x[j] * inv - offset;
  const GroupDist<N> dist(t, w);
  const int key = grid.key_of(t);
  if (const int e = grid.entry_at(key); e >= 0) {
    // Each coordinate already sits at its nearest level, so no entry does better.
    *entry = uint16_t(e);
    return dist(grid.entry(e));
  }
  // The first of equally good candidates wins. Selects rather than a branch, which
  // mispredicts on about every other candidate.
  float best = INFINITY;
  int best_e = -1;
  auto consider = [&](float err, int e) {
    const bool better = err < best;
    best_e = better ? e : best_e;
    best = better ? err : best;
  };
  const std::span<const uint16_t> nb = grid.neighbours(key);
  size_t k = 0;
  for (; k + 4 <= nb.size(); k += 4) {
    float err[4];
    dist.four(grid.entry(nb[k]), grid.entry(nb[k + 1]), grid.entry(nb[k + 2]), grid.entry(nb[k + 3]), err);
    for (int i = 0; i < 4; ++i) consider(err[i], nb[k + size_t(i)]);
  }
  for (; k < nb.size(); ++k) consider(dist(grid.entry(nb[k])), nb[k]);
  if (best_e >= 0) *entry = uint16_t(best_e);
  return best;
}

// The instance for this grid's width, so that the loops above unroll.
float best_entry(const IqGridIndex& grid, const float* x, const float* w, float inv, float offset, uint16_t* entry) {
  if (grid.dims() == 8) return best_entry<8>(grid, x, w, inv, offset, entry);  // IQ2, IQ1
  AFF_CHECK(grid.dims() == 4);                                                // IQ3_XXS
  return best_entry<4>(grid, x, w, inv, offset, entry);
}

// Assignment of all groups at 1/scale = inv with every group's offset = sign * delta
// (kNone: 0) unless per_group, where each group takes the better sign. Returns the scaled
// error sum.
float assign_groups(const IqFitSpec& spec, const float* x, const float* w, int len, float inv, bool negative,
                    IqSubBlockFit* fit) {
  const IqGridIndex& grid = *spec.grid;
  const int n = grid.dims();
  float total = 0.0f;
  for (int g = 0; g < len / n; ++g) {
    const float* xg = x + g * n;
    const float* wg = w + g * n;
    if (spec.offset == IqOffset::kPerGroup) {
      uint16_t e_pos = 0, e_neg = 0;
      const float err_pos = best_entry(grid, xg, wg, inv, spec.delta, &e_pos);
      const float err_neg = best_entry(grid, xg, wg, inv, -spec.delta, &e_neg);
      const bool neg = err_neg < err_pos;
      fit->entry[g] = neg ? e_neg : e_pos;
      fit->neg_offset[g] = neg;
      total += neg ? err_neg : err_pos;
    } else {
      const float offset = spec.offset == IqOffset::kNone ? 0.0f : negative ? -spec.delta : spec.delta;
      total += best_entry(grid, xg, wg, inv, offset, &fit->entry[g]);
      fit->neg_offset[g] = negative && spec.offset != IqOffset::kNone;
    }
  }
  return total;
}

// sum w x v and sum w v v over the sub-block, v = G[entry] + offset: the least-squares
// scale for these entries is sxv / svv and its error sum w x² - sxv² / svv. Every trial
// scale of stage 1 needs them, so they run in four double lanes (value i in lane i % 4,
// groups being 4 or 8 wide), reduced as (0 + 2) + (1 + 3); the scalar fallback keeps the
// same order and so the same bits.
void fit_sums(const IqFitSpec& spec, const float* x, const float* w, int len, const IqSubBlockFit& fit, double* sxv,
              double* svv) {
  const int n = spec.grid->dims();
#if defined(__SSE2__)
  __m128d xv01 = _mm_setzero_pd(), xv23 = _mm_setzero_pd(), vv01 = _mm_setzero_pd(), vv23 = _mm_setzero_pd();
  for (int i = 0; i < len; i += 4) {
    const int g = i / n;
    const float offset = spec.offset == IqOffset::kNone ? 0.0f : fit.neg_offset[g] ? -spec.delta : spec.delta;
    // G + offset is exact in float (small integers plus ±1/8), as it is in double.
    const __m128 v = _mm_add_ps(_mm_loadu_ps(spec.grid->entry(fit.entry[g]) + (i - g * n)), _mm_set1_ps(offset));
    const __m128 xf = _mm_loadu_ps(x + i), wf = _mm_loadu_ps(w + i);
    const __m128d v01 = _mm_cvtps_pd(v), v23 = _mm_cvtps_pd(_mm_movehl_ps(v, v));
    const __m128d w01 = _mm_cvtps_pd(wf), w23 = _mm_cvtps_pd(_mm_movehl_ps(wf, wf));
    const __m128d x01 = _mm_cvtps_pd(xf), x23 = _mm_cvtps_pd(_mm_movehl_ps(xf, xf));
    xv01 = _mm_add_pd(xv01, _mm_mul_pd(_mm_mul_pd(w01, x01), v01));
    xv23 = _mm_add_pd(xv23, _mm_mul_pd(_mm_mul_pd(w23, x23), v23));
    vv01 = _mm_add_pd(vv01, _mm_mul_pd(_mm_mul_pd(w01, v01), v01));
    vv23 = _mm_add_pd(vv23, _mm_mul_pd(_mm_mul_pd(w23, v23), v23));
  }
  const __m128d xv = _mm_add_pd(xv01, xv23), vv = _mm_add_pd(vv01, vv23);  // lanes 0+2, 1+3
  *sxv = _mm_cvtsd_f64(_mm_add_sd(xv, _mm_unpackhi_pd(xv, xv)));
  *svv = _mm_cvtsd_f64(_mm_add_sd(vv, _mm_unpackhi_pd(vv, vv)));
#else
  double xv[4] = {}, vv[4] = {};
  for (int i = 0; i < len; i += 4) {
    const int g = i / n;
    const float offset = spec.offset == IqOffset::kNone ? 0.0f : fit.neg_offset[g] ? -spec.delta : spec.delta;
    const float* e = spec.grid->entry(fit.entry[g]) + (i - g * n);
    for (int k = 0; k < 4; ++k) {
      const double v = double(e[k] + offset);
      xv[k] += double(w[i + k]) * double(x[i + k]) * v;
      vv[k] += double(w[i + k]) * v * v;
    }
  }
  *sxv = (xv[0] + xv[2]) + (xv[1] + xv[3]);
  *svv = (vv[0] + vv[2]) + (vv[1] + vv[3]);
#endif
}

double weighted_norm2(const float* x, const float* w, int len) {
  double s = 0.0;
  for (int i = 0; i < len; ++i) s += double(w[i]) * x[i] * x[i];
  return s;
}

// Entries for an all-zero sub-block: those nearest zero (the decoder cannot give exact
// zeros unless d is 0, so these keep the damage smallest).
IqSubBlockFit zero_fit(const IqFitSpec& spec, const float* x, const float* w, int len) {
  IqSubBlockFit fit = iq_assign_at_scale(spec, x, w, len, 1.0f);
  fit.scale = 0.0f;
  fit.err = weighted_norm2(x, w, len);
  return fit;
}

}  // namespace

IqSubBlockFit iq_assign_at_scale(const IqFitSpec& spec, const float* x, const float* w, int len, float scale) {
  AFF_CHECK(scale > 0.0f && len % spec.grid->dims() == 0 && len / spec.grid->dims() <= kIqMaxGroups);
  const float inv = 1.0f / scale;
  IqSubBlockFit fit;
  fit.scale = scale;
  float err = assign_groups(spec, x, w, len, inv, false, &fit);
  if (spec.offset == IqOffset::kPerSubBlock) {
    IqSubBlockFit neg = fit;
    const float err_neg = assign_groups(spec, x, w, len, inv, true, &neg);
    if (err_neg < err) fit = neg, err = err_neg;
  }
  fit.err = double(err) * double(scale) * double(scale);
  return fit;
}

IqSubBlockFit iq_fit_sub_block(const IqFitSpec& spec, const float* x, const float* w, int len) {
  float amax = 0.0f;
  for (int i = 0; i < len; ++i) amax = std::fmax(amax, std::fabs(x[i]));
  if (amax == 0.0f) return zero_fit(spec, x, w, len);
  const double norm2 = weighted_norm2(x, w, len);

  // The least-squares scale of a trial's entries, and its error; a trial whose entries
  // anti-correlate with x (possible only with tiny weights) is no candidate.
  auto settle = [&](IqSubBlockFit* fit) {
    double sxv, svv;
    fit_sums(spec, x, w, len, *fit, &sxv, &svv);
    if (!(sxv > 0.0 && svv > 0.0)) return false;
    fit->scale = float(sxv / svv);
    fit->err = std::max(0.0, norm2 - sxv * sxv / svv);
    return fit->scale > 0.0f;
  };

  IqSubBlockFit best;
  bool have = false;
  auto trial = [&](float scale) {
    IqSubBlockFit fit = iq_assign_at_scale(spec, x, w, len, scale);
    if (settle(&fit) && (!have || fit.err < best.err)) best = fit, have = true;
  };
  for (int k = 0; k < spec.n_trials; ++k) {
    const float ratio =
        spec.ratio_lo + (spec.ratio_hi - spec.ratio_lo) * float(k) / float(std::max(1, spec.n_trials - 1));
    trial(amax / (ratio * spec.grid->top_level()));
  }
  // The codebooks hold few points with several large coordinates (IQ2_XXS has no all-25
  // or all-43 entry), so values of similar size fit best all on one lower level, a scale
  // the trials above never come near: try the largest value on each positive lower level.
  for (int l = 0; l + 1 < spec.grid->n_levels(); ++l) {
    if (spec.grid->level(l) > 0.0f) trial(amax / spec.grid->level(l));
  }
  if (!have) return zero_fit(spec, x, w, len);

  // Alternate entries-for-scale and scale-for-entries; each step cannot raise the error
  // in exact arithmetic, so stop as soon as it does not fall.
  for (int iter = 0; iter < 8; ++iter) {
    IqSubBlockFit next = iq_assign_at_scale(spec, x, w, len, best.scale);
    if (!settle(&next) || !(next.err < best.err)) break;
    best = next;
  }
  return best;
}

IqQuantizedScales iq_quantize_scales(const IqFitSpec& spec, const float* x, const float* w, int sub_len, int n_sub,
                                     const IqSubBlockFit* fits, int max_code, IqScaleFn scale_of) {
  AFF_CHECK(n_sub <= 16 && max_code >= 1);
  IqQuantizedScales out;
  float s_max = 0.0f;
  for (int i = 0; i < n_sub; ++i) s_max = std::fmax(s_max, fits[i].scale);
  auto all_zero = [&] {
    IqQuantizedScales z;
    for (int i = 0; i < n_sub; ++i) z.fit[i] = zero_fit(spec, x + i * sub_len, w + i * sub_len, sub_len);
    return z;
  };
  if (!(s_max > 0.0f)) return all_zero();

  const float d_top = s_max / scale_of(1.0f, max_code);
  double best_total = INFINITY;
  for (const float factor : kSuperScaleTrials) {
    const uint16_t d_bits = f32_to_f16(std::fmin(d_top * factor, kMaxF16));
    const float d = f16_to_f32(d_bits);
    if (!(d > 0.0f)) continue;  // underflowed: the block is too small for f16
    IqQuantizedScales trial;
    trial.d_bits = d_bits;
    trial.d = d;
    double total = 0.0;
    for (int i = 0; i < n_sub && total < best_total; ++i) {
      const float* xs = x + i * sub_len;
      const float* ws = w + i * sub_len;
      // The code whose decoded scale is nearest the ideal one, then its neighbours: the
      // entries re-picked at each decoded scale decide which is really best.
      int nearest = 0;
      for (int c = 1; c <= max_code; ++c) {
        if (std::fabs(scale_of(d, c) - fits[i].scale) < std::fabs(scale_of(d, nearest) - fits[i].scale)) nearest = c;
      }
      bool have = false;
      for (int c = std::max(0, nearest - 1); c <= std::min(max_code, nearest + 1); ++c) {
        const IqSubBlockFit fit = iq_assign_at_scale(spec, xs, ws, sub_len, scale_of(d, c));
        if (!have || fit.err < trial.fit[i].err) trial.fit[i] = fit, trial.code[i] = c, have = true;
      }
      total += trial.fit[i].err;
    }
    if (total < best_total) best_total = total, out = trial;
  }
  if (!(best_total < INFINITY)) return all_zero();
  return out;
}

uint8_t iq_fold_signs8(const float* x, const float* w, float* t) {
  uint8_t signs = 0;
  int cheapest = 0;
  for (int j = 0; j < 8; ++j) {
    t[j] = std::fabs(x[j]);
    if (x[j] < 0.0f) signs = uint8_t(signs | (1u << j));
    if (w[j] * x[j] * x[j] < w[cheapest] * x[cheapest] * x[cheapest]) cheapest = j;
  }
  if (std::popcount(signs) % 2 != 0) {
    signs = uint8_t(signs ^ (1u << cheapest));
    t[cheapest] = -t[cheapest];
  }
  return signs;
}

void iq_block_weights(const float* imp, int n, float* w) {
  double mean = 0.0;
  if (imp != nullptr) {
    for (int i = 0; i < n; ++i) mean += imp[i];
    mean /= n;
  }
  if (!(mean > 0.0)) {
    std::fill(w, w + n, 1.0f);
    return;
  }
  const float floor = float(1e-3 * mean);
  for (int i = 0; i < n; ++i) w[i] = imp[i] + floor;
}

}  // namespace aff::quant
