// gemm_rows_bf16: decodes W in row blocks of at most kTileElems elements into
// a bf16 scratch and multiplies each block with cuBLAS (bf16 inputs, f32
// accumulation and output). In kBf16x3 the activations are split into hi and
// lo bf16 and the block is multiplied twice (beta = 1 the second time): W in
// bf16 is exact for the stored formats, so only x's rounding needed undoing.
//
// Scratch lives in a per-stream context: the first call at a new size
// allocates (cudaMalloc synchronises), later calls reuse it.
#include <cublas_v2.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "backend/cuda/kernels/gemm/gemm.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/device_buffer.h"

namespace aff::cuda {
namespace {

// 32 Mi elements (64 MiB of bf16) per decoded weight block: big enough that
// cuBLAS runs at full rate, small enough for the vocabulary head.
constexpr int64_t kTileElems = int64_t(32) << 20;

Status cublas_status(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::ok();
  return internal_error(std::string("cuBLAS ") + what + ": " + cublasGetStatusName(s) + ": " +
                        cublasGetStatusString(s));
}

struct GemmContext {
  cublasHandle_t handle = nullptr;
  DeviceBuffer w_tile;     // bf16 [rows, in]
  DeviceBuffer x_hi, x_lo; // bf16 [T, in]
  DeviceBuffer workspace;  // cuBLAS workspace (no allocation inside cuBLAS calls)
  std::mutex mu;           // one call at a time per stream
};

Status grow(DeviceBuffer& b, size_t bytes, const char* what) {
  if (b.bytes() >= bytes) return Status::ok();
  b = DeviceBuffer();  // free first: the old and new buffers need not coexist
  AFF_ASSIGN_OR_RETURN(b, DeviceBuffer::allocate(bytes, what));
  return Status::ok();
}

Result<GemmContext*> context_for(cudaStream_t stream) {
  static std::mutex mu;
  static std::map<cudaStream_t, std::unique_ptr<GemmContext>> contexts;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = contexts[stream];
  if (!slot) {
    auto ctx = std::make_unique<GemmContext>();
    AFF_RETURN_IF_ERROR(cublas_status(cublasCreate(&ctx->handle), "cublasCreate"));
    AFF_RETURN_IF_ERROR(cublas_status(cublasSetStream(ctx->handle, stream), "cublasSetStream"));
    AFF_RETURN_IF_ERROR(grow(ctx->workspace, size_t(32) << 20, "cuBLAS workspace"));
    AFF_RETURN_IF_ERROR(cublas_status(cublasSetWorkspace(ctx->handle, ctx->workspace.data(), ctx->workspace.bytes()),
                                      "cublasSetWorkspace"));
    AFF_RETURN_IF_ERROR(cublas_status(cublasSetMathMode(ctx->handle, CUBLAS_DEFAULT_MATH), "cublasSetMathMode"));
    slot = std::move(ctx);
  }
  return slot.get();
}

}  // namespace

Status gemm_rows_bf16(const DeviceLinear& w, int64_t row_begin, int64_t row_end, const float* x, int64_t ldx,
                      int64_t T, float* y, int64_t ldy, MmaPrecision precision, cudaStream_t stream) {
  const int64_t rows = row_end - row_begin;
  if (T <= 0 || rows <= 0) return Status::ok();
  if (!gemm_supports(w, precision))
    return unsupported("gemm: weight format has no tensor-core path at this precision on the GPU");
  if (row_begin < 0 || row_end > w.out || ldx < w.in || ldy < rows)
    return internal_error("gemm: row range or strides out of bounds");
  if (w.in > INT32_MAX || T > INT32_MAX || ldy > INT32_MAX) return internal_error("gemm: shape exceeds cuBLAS int");
  AFF_ASSIGN_OR_RETURN(GemmContext * ctx, context_for(stream));
  std::lock_guard<std::mutex> lock(ctx->mu);
  const bool split = precision == MmaPrecision::kBf16x3;
  const int64_t tile_rows = std::min(rows, std::max<int64_t>(128, kTileElems / w.in / 128 * 128));
  if (w.format != DevFormat::kBF16)
    AFF_RETURN_IF_ERROR(grow(ctx->w_tile, size_t(tile_rows * w.in) * 2, "gemm weight tile"));
  AFF_RETURN_IF_ERROR(grow(ctx->x_hi, size_t(T * w.in) * 2, "gemm activations"));
  if (split) AFF_RETURN_IF_ERROR(grow(ctx->x_lo, size_t(T * w.in) * 2, "gemm activations"));
  uint16_t* xh = ctx->x_hi.as<uint16_t>();
  uint16_t* xl = split ? ctx->x_lo.as<uint16_t>() : nullptr;
  AFF_RETURN_IF_ERROR(split_rows_bf16(x, ldx, T, w.in, xh, xl, stream));
  const float one = 1.0f, zero = 0.0f;
  for (int64_t r0 = row_begin; r0 < row_end; r0 += tile_rows) {
    const int64_t n = std::min(tile_rows, row_end - r0);
    // BF16 weights are multiplied in place; the others are decoded into the tile.
    const uint16_t* wt = reinterpret_cast<const uint16_t*>(w.weight) + r0 * w.in;
    if (w.format != DevFormat::kBF16) {
      AFF_RETURN_IF_ERROR(dequant_rows_bf16(w, r0, n, ctx->w_tile.as<uint16_t>(), stream));
      wt = ctx->w_tile.as<uint16_t>();
    }
    // cuBLAS is column-major: y^T [n, T] (ld ldy) = op_T(A) B with A = the tile seen as
    // [in, n] column-major (ld in) and B = x^T, [in, T] column-major (ld in).
    for (int pass = 0; pass < (split ? 2 : 1); ++pass) {
      AFF_RETURN_IF_ERROR(cublas_status(
          cublasGemmEx(ctx->handle, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(T), int(w.in), &one, wt, CUDA_R_16BF,
                       int(w.in), pass == 0 ? xh : xl, CUDA_R_16BF, int(w.in), pass == 0 ? &zero : &one,
                       y + (r0 - row_begin), CUDA_R_32F, int(ldy), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx"));
    }
  }
  return Status::ok();
}

}  // namespace aff::cuda
