// Portable kernels: dequantise one weight row with the reference codec and dot it with
// the dequantised activation in f64. The fallback where the CPU lacks AVX2; every SIMD
// kernel is tested against exactly this arithmetic.
#include <vector>

#include "backend/cpu/act_quant.h"
#include "backend/cpu/isa/gemv_isa.h"
#include "core/check.h"
#include "quant/codec.h"

namespace aff::cpu::isa {
namespace {

void gemv_dequant(quant::GgmlType type, ActFormat af, const uint8_t* w, int64_t row_bytes, int64_t rows,
                  int64_t cols, const void* act, float* y) {
  std::vector<float> x(static_cast<size_t>(cols)), row(static_cast<size_t>(cols));
  dequantize_act(af, act, x);
  for (int64_t r = 0; r < rows; ++r) {
    const Status st = quant::dequantize_row(type, {w + r * row_bytes, size_t(row_bytes)}, row);
    AFF_CHECK(st.is_ok());
    double s = 0.0;
    for (int64_t i = 0; i < cols; ++i) s += double(row[size_t(i)]) * double(x[size_t(i)]);
    y[r] = float(s);
  }
}

}  // namespace

void gemv_q8_0_q8_0_scalar(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* a, float* y) {
  gemv_dequant(quant::GgmlType::kQ8_0, ActFormat::kQ8_0, w, rb, rows, cols, a, y);
}
void gemv_q4k_q8k_scalar(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* a, float* y) {
  gemv_dequant(quant::GgmlType::kQ4_K, ActFormat::kQ8K, w, rb, rows, cols, a, y);
}
void gemv_q2k_q8k_scalar(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* a, float* y) {
  gemv_dequant(quant::GgmlType::kQ2_K, ActFormat::kQ8K, w, rb, rows, cols, a, y);
}
void gemv_iq2xxs_q8k_scalar(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* a, float* y) {
  gemv_dequant(quant::GgmlType::kIQ2_XXS, ActFormat::kQ8K, w, rb, rows, cols, a, y);
}
void gemv_mxfp4_q8_0_scalar(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* a, float* y) {
  gemv_dequant(quant::GgmlType::kMXFP4, ActFormat::kQ8_0, w, rb, rows, cols, a, y);
}

void gemv_q3k_q8k_scalar(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* a, float* y) {
  gemv_dequant(quant::GgmlType::kQ3_K, ActFormat::kQ8K, w, rb, rows, cols, a, y);
}
void gemv_iq4xs_q8k_scalar(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* a, float* y) {
  gemv_dequant(quant::GgmlType::kIQ4_XS, ActFormat::kQ8K, w, rb, rows, cols, a, y);
}
void gemv_iq2xs_q8k_scalar(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* a, float* y) {
  gemv_dequant(quant::GgmlType::kIQ2_XS, ActFormat::kQ8K, w, rb, rows, cols, a, y);
}
void gemv_iq3xxs_q8k_scalar(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* a, float* y) {
  gemv_dequant(quant::GgmlType::kIQ3_XXS, ActFormat::kQ8K, w, rb, rows, cols, a, y);
}
void gemv_iq1s_q8k_scalar(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* a, float* y) {
  gemv_dequant(quant::GgmlType::kIQ1_S, ActFormat::kQ8K, w, rb, rows, cols, a, y);
}
void gemv_iq1m_q8k_scalar(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* a, float* y) {
  gemv_dequant(quant::GgmlType::kIQ1_M, ActFormat::kQ8K, w, rb, rows, cols, a, y);
}

}  // namespace aff::cpu::isa
