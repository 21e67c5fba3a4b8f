// y = W x for a stored weight in any of the checkpoint formats (F32, BF16, F16,
// FP8 E4M3 with square E8M0 block scales, MXFP4 with per-32 E8M0 scales),
// batched over T tokens. The weight is dequantised a few rows at a time inside
// the kernel: no f32 copy of a matrix is ever kept.
#pragma once

#include <cstdint>

#include "model/dsv4/weights.h"

namespace aff::ref {

// Dequantises row `row` of w into out: [w.in] f32, exactly value(code) * scale.
void linear_dequant_row(const dsv4::Linear& w, int64_t row, float* out);

// y[t, r] = sum_i W[r, i] * x[t, i] for every row r of w.
//   x: [T, w.in] row-major, y: [T, w.out] row-major.
void linear(const dsv4::Linear& w, const float* x, int64_t T, float* y);

// The same restricted to rows [row_begin, row_end), with explicit strides:
//   x: T rows of w.in values, row t at x + t*ldx;
//   y: T rows of (row_end - row_begin) values, row t at y + t*ldy.
// Used by the grouped output projection (one row block per head group).
void linear_rows(const dsv4::Linear& w, int64_t row_begin, int64_t row_end, const float* x,
                 int64_t ldx, int64_t T, float* y, int64_t ldy);

}  // namespace aff::ref
