#include "backend/cuda/linear.h"

#include "backend/cuda/kernels/gemm/gemm.h"
#include "backend/cuda/kernels/gemm/mma_precision.h"
#include "backend/cuda/kernels/gemv/gemv.h"

namespace aff::cuda {

bool linear_uses_gemm(const DeviceLinear& w, int64_t T) {
  return T >= kGemmMinTokens && gemm_supports(w, mma_precision());
}

Status linear_rows(const DeviceLinear& w, int64_t row_begin, int64_t row_end, const float* x, int64_t ldx,
                   int64_t T, float* y, int64_t ldy, cudaStream_t stream) {
  if (linear_uses_gemm(w, T))
    return gemm_rows_bf16(w, row_begin, row_end, x, ldx, T, y, ldy, mma_precision(), stream);
  return gemv_rows_f32(w, row_begin, row_end, x, ldx, T, y, ldy, stream);
}

Status linear_grouped(const DeviceLinear& w, int G, int64_t R, const float* x, int64_t ldx, int64_t T, float* y,
                      int64_t ldy, cudaStream_t stream) {
  if (linear_uses_gemm(w, T)) return gemm_grouped_rows_bf16(w, G, R, x, ldx, T, y, ldy, mma_precision(), stream);
  for (int g = 0; g < G; ++g)
    AFF_RETURN_IF_ERROR(gemv_rows_f32(w, g * R, (g + 1) * R, x + g * w.in, ldx, T, y + g * R, ldy, stream));
  return Status::ok();
}

}  // namespace aff::cuda
