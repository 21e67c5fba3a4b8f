#include "quant/scale_search.h"

#include <cmath>
#include <initializer_list>

namespace aff::quant {
namespace {

inline float weight(const float* w, int i) { return w ? w[i] : 1.0f; }

// Error of x against scale*q + offset with q chosen by rounding; fills q.
float affine_error(const float* x, const float* w, int len, int nmax, float scale, float offset,
                   int* q) {
  float err = 0.0f;
  const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
  for (int i = 0; i < len; ++i) {
    q[i] = round_clamp((x[i] - offset) * inv, 0, nmax);
    const float d = scale * float(q[i]) + offset - x[i];
    err += weight(w, i) * d * d;
  }
  return err;
}

// Weighted least squares for (scale, offset) given fixed q, with offset <= 0 enforced.
bool solve_affine(const float* x, const float* w, int len, const int* q, float* scale,
                  float* offset) {
  double sw = 0, sq = 0, sqq = 0, sx = 0, sqx = 0;
  for (int i = 0; i < len; ++i) {
    const double wi = weight(w, i);
    sw += wi, sq += wi * q[i], sqq += wi * q[i] * q[i], sx += wi * x[i], sqx += wi * q[i] * x[i];
  }
  const double det = sw * sqq - sq * sq;
  double s = 0, b = 0;
  if (det > 0) {
    s = (sw * sqx - sq * sx) / det;
    b = (sqq * sx - sq * sqx) / det;
  }
  if (det <= 0 || b > 0) {  // the format can only subtract a min: refit with offset 0
    b = 0;
    if (sqq <= 0) return false;
    s = sqx / sqq;
  }
  if (!(s > 0)) return false;
  *scale = float(s), *offset = float(b);
  return true;
}

}  // namespace

ScaleMin fit_scale_min(const float* x, const float* w, int len, int nmax) {
  float lo = 0.0f, hi = x[0];
  for (int i = 0; i < len; ++i) lo = std::fmin(lo, x[i]), hi = std::fmax(hi, x[i]);
  if (!(hi > lo)) return {0.0f, -lo};
  int q[256], q_try[256];
  // Candidate grids slightly denser and sparser than the plain min..max spread, each refit
  // by least squares: the refit moves the scale off the grid to where the rounded values
  // actually want it.
  float best_scale = (hi - lo) / float(nmax), best_offset = lo;
  float best_err = affine_error(x, w, len, nmax, best_scale, best_offset, q);
  for (int k = -10; k <= 10; ++k) {
    const float scale = (hi - lo) / (float(nmax) + 0.05f * float(k));
    affine_error(x, w, len, nmax, scale, lo, q_try);
    float s, b;
    if (!solve_affine(x, w, len, q_try, &s, &b)) continue;
    const float err = affine_error(x, w, len, nmax, s, b, q_try);
    if (err < best_err) best_err = err, best_scale = s, best_offset = b;
  }
  return {best_scale, -best_offset};
}

int nearest_level(const float* levels, int n, float v) {
  if (v <= levels[0]) return 0;
  if (v >= levels[n - 1]) return n - 1;
  int lo = 0, hi = n - 1;  // levels[lo] < v < levels[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    (v < levels[mid] ? hi : lo) = mid;
  }
  return (v - levels[lo] <= levels[hi] - v) ? lo : hi;
}

float levels_error(const float* x, const float* w, int len, const float* levels, int n_levels,
                   float scale) {
  float err = 0.0f;
  if (scale == 0.0f) {
    for (int i = 0; i < len; ++i) err += weight(w, i) * x[i] * x[i];
    return err;
  }
  const float inv = 1.0f / scale;
  for (int i = 0; i < len; ++i) {
    const float d = scale * levels[nearest_level(levels, n_levels, x[i] * inv)] - x[i];
    err += weight(w, i) * d * d;
  }
  return err;
}

float fit_scale_levels(const float* x, const float* w, int len, const float* levels,
                       int n_levels) {
  float amax = 0.0f, vmax = 0.0f;
  for (int i = 0; i < len; ++i) {
    if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), vmax = x[i];
  }
  if (amax == 0.0f) return 0.0f;
  float best = vmax / levels[0];
  float best_err = levels_error(x, w, len, levels, n_levels, best);
  // Map the largest element onto either end of the table, over a range of slightly
  // larger and smaller scales, each refit by least squares on its level assignment.
  for (const float end : {levels[0], levels[n_levels - 1]}) {
    for (int k = -8; k <= 8; ++k) {
      const float scale = vmax / end * (1.0f + 0.025f * float(k));
      const float inv = 1.0f / scale;
      double sxv = 0, svv = 0;
      for (int i = 0; i < len; ++i) {
        const float v = levels[nearest_level(levels, n_levels, x[i] * inv)];
        sxv += double(weight(w, i)) * x[i] * v, svv += double(weight(w, i)) * v * v;
      }
      for (const float s : {scale, svv > 0 ? float(sxv / svv) : scale}) {
        const float err = levels_error(x, w, len, levels, n_levels, s);
        if (err < best_err) best_err = err, best = s;
      }
    }
  }
  return best;
}

}  // namespace aff::quant
