// The CPU lane behind the reference linear: a whole `Linear` stored as ggml blocks
// (WeightFormat::kGgml) computed over T tokens with the quantised dot-product kernels
// (gemv.h), threaded over rows. The reference backend calls this first and falls back
// to dequantising rows when it declines (lane off, type without a SIMD kernel).
//
// Numerics differ from the reference by the activation quantisation only: each token is
// rounded to int8 per 32 (Q8_0, MXFP4) or 256 (K/IQ types) inputs with step
// max|x_block| / 127, so |y_fast - y_ref| <= sum_i |W[r,i]| * max|x_block(i)| / 254 plus
// f32 rounding. Results do not depend on the thread count or on T's batching.
#pragma once

#include <cstdint>

#include "model/dsv4/weights.h"

namespace aff::cpu {

// Whether the lane is used. Default: on, unless the environment sets AFF_CPU_LANE=0
// (read on first use; declared in the option table as --cpu-lane).
bool cpu_lane_enabled();
// Overrides the environment for this process (the CLI's --cpu-lane; tests comparing paths).
void set_cpu_lane_enabled(bool on);

// True if the lane can compute w: kGgml with a SIMD kernel for its type on this CPU and
// an input width that is a whole number of activation blocks. Ignores cpu_lane_enabled().
bool linear_fast_supported(const dsv4::Linear& w);

// y[t*ldy + r - row_begin] = sum_i W[r, i] * x[t*ldx + i] for r in [row_begin, row_end),
// t < T (same contract as ref::linear_rows):
//   x: T rows of w.in f32, row t at x + t*ldx;
//   y: T rows of (row_end - row_begin) f32, row t at y + t*ldy.
// Returns false, touching nothing, when the lane is disabled or !linear_fast_supported(w).
bool linear_fast_rows(const dsv4::Linear& w, int64_t row_begin, int64_t row_end, const float* x, int64_t ldx,
                      int64_t T, float* y, int64_t ldy);

}  // namespace aff::cpu
