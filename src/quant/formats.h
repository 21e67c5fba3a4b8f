// Per-format row codecs behind quant/codec.h. Each takes n elements (a multiple of the
// block size, checked by the caller) and the row's blocks. Quantisers take an optional
// importance vector imp[n] (nullptr = uniform weights).
#pragma once

#include <cstdint>

#include "quant/blocks.h"

namespace aff::quant {

// q8_0.cpp
void dequantize_row_q8_0(const BlockQ8_0* x, float* y, int64_t n);
void quantize_row_q8_0(const float* x, BlockQ8_0* y, int64_t n, const float* imp);

// mxfp4.cpp
void dequantize_row_mxfp4(const BlockMxfp4* x, float* y, int64_t n);
void quantize_row_mxfp4(const float* x, BlockMxfp4* y, int64_t n, const float* imp);

// k_quants.cpp
void dequantize_row_q2_k(const BlockQ2K* x, float* y, int64_t n);
void dequantize_row_q3_k(const BlockQ3K* x, float* y, int64_t n);
void dequantize_row_q4_k(const BlockQ4K* x, float* y, int64_t n);
void dequantize_row_q5_k(const BlockQ5K* x, float* y, int64_t n);
void dequantize_row_q6_k(const BlockQ6K* x, float* y, int64_t n);
void quantize_row_q2_k(const float* x, BlockQ2K* y, int64_t n, const float* imp);
void quantize_row_q3_k(const float* x, BlockQ3K* y, int64_t n, const float* imp);
void quantize_row_q4_k(const float* x, BlockQ4K* y, int64_t n, const float* imp);

// iq4.cpp
void dequantize_row_iq4_nl(const BlockIq4Nl* x, float* y, int64_t n);
void dequantize_row_iq4_xs(const BlockIq4Xs* x, float* y, int64_t n);
void quantize_row_iq4_nl(const float* x, BlockIq4Nl* y, int64_t n, const float* imp);
void quantize_row_iq4_xs(const float* x, BlockIq4Xs* y, int64_t n, const float* imp);

// iq2.cpp
void dequantize_row_iq2_xxs(const BlockIq2Xxs* x, float* y, int64_t n);
void dequantize_row_iq2_xs(const BlockIq2Xs* x, float* y, int64_t n);

// iq3.cpp
void dequantize_row_iq3_xxs(const BlockIq3Xxs* x, float* y, int64_t n);

// iq1.cpp
void dequantize_row_iq1_s(const BlockIq1S* x, float* y, int64_t n);
void dequantize_row_iq1_m(const BlockIq1M* x, float* y, int64_t n);

}  // namespace aff::quant
