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
#include "backend/cuda/kernels/gemm/gemm_context.h"
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

Status grow(DeviceBuffer& b, size_t bytes, const char* what) {
  if (b.bytes() >= bytes) return Status::ok();
  b = DeviceBuffer();  // free first: the old and new buffers need not coexist
  AFF_ASSIGN_OR_RETURN(b, DeviceBuffer::allocate(bytes, what));
  return Status::ok();
}

}  // namespace

Result<GemmContext*> gemm_context(cudaStream_t stream) {
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
    slot = std::move(ctx);
  }
  return slot.get();
}

Result<void*> gemm_scratch(GemmContext& ctx, GemmBuf which, size_t bytes) {
  AFF_RETURN_IF_ERROR(grow(ctx.buf[size_t(which)], bytes, "gemm scratch"));
  return ctx.buf[size_t(which)].data();
}

GemmSharedInput::GemmSharedInput(const float* x, int64_t ldx, int64_t T, int64_t in, cudaStream_t stream)
    : stream_(stream) {
  Result<GemmContext*> ctx = gemm_context(stream);
  if (!ctx.is_ok()) return;  // no context: every GEMM splits its own input
  std::lock_guard<std::mutex> lock((*ctx)->mu);
  SharedInputState& sh = (*ctx)->shared;
  sh = SharedInputState{};
  sh.x = x, sh.ldx = ldx, sh.T = T, sh.in = in;
}

GemmSharedInput::~GemmSharedInput() {
  Result<GemmContext*> ctx = gemm_context(stream_);
  if (!ctx.is_ok()) return;
  std::lock_guard<std::mutex> lock((*ctx)->mu);
  (*ctx)->shared = SharedInputState{};
}

Status gemm_input_bf16(GemmContext& ctx, const float* x, int64_t ldx, int64_t T, int64_t in, bool want_lo,
                       const uint16_t** hi, const uint16_t** lo, cudaStream_t stream) {
  SharedInputState& sh = ctx.shared;
  const bool shared = sh.x == x && sh.ldx == ldx && sh.T == T && sh.in == in;
  const GemmBuf bh = shared ? kBufSharedHi : kBufXHi, bl = shared ? kBufSharedLo : kBufXLo;
  AFF_ASSIGN_OR_RETURN(void* h, gemm_scratch(ctx, bh, size_t(T * in) * 2));
  void* l = nullptr;
  if (want_lo) {
    AFF_ASSIGN_OR_RETURN(l, gemm_scratch(ctx, bl, size_t(T * in) * 2));
  }
  if (!shared || !sh.has_hi || (want_lo && !sh.has_lo)) {
    AFF_RETURN_IF_ERROR(split_rows_bf16(x, ldx, T, in, static_cast<uint16_t*>(h), static_cast<uint16_t*>(l), stream));
    if (shared) sh.has_hi = true, sh.has_lo = want_lo;
  }
  *hi = static_cast<const uint16_t*>(h);
  if (lo != nullptr) *lo = static_cast<const uint16_t*>(l);
  return Status::ok();
}

Status gemm_bf16_f32(GemmContext& ctx, int64_t n, int64_t T, int64_t K, const uint16_t* w, const uint16_t* x_hi,
                     const uint16_t* x_lo, int64_t ldx, float* y, int64_t ldy) {
  if (n <= 0 || T <= 0) return Status::ok();
  if (n > INT32_MAX || T > INT32_MAX || K > INT32_MAX || ldx > INT32_MAX || ldy > INT32_MAX)
    return internal_error("gemm: shape exceeds cuBLAS int");
  const float one = 1.0f, zero = 0.0f;
  // cuBLAS is column-major: y^T [n, T] (ld ldy) = op_T(A) B with A = W seen as
  // [K, n] column-major (ld K) and B = x^T, [K, T] column-major (ld ldx).
  for (int pass = 0; pass < (x_lo ? 2 : 1); ++pass) {
    AFF_RETURN_IF_ERROR(cublas_status(
        cublasGemmEx(ctx.handle, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(T), int(K), &one, w, CUDA_R_16BF, int(K),
                     pass == 0 ? x_hi : x_lo, CUDA_R_16BF, int(ldx), pass == 0 ? &zero : &one, y, CUDA_R_32F,
                     int(ldy), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx"));
  }
  return Status::ok();
}

Status gemm_rows_bf16(const DeviceLinear& w, int64_t row_begin, int64_t row_end, const float* x, int64_t ldx,
                      int64_t T, float* y, int64_t ldy, MmaPrecision precision, cudaStream_t stream) {
  const int64_t rows = row_end - row_begin;
  if (T <= 0 || rows <= 0) return Status::ok();
  if (!gemm_supports(w, precision))
    return unsupported("gemm: weight format has no tensor-core path at this precision on the GPU");
  if (row_begin < 0 || row_end > w.out || ldx < w.in || ldy < rows)
    return internal_error("gemm: row range or strides out of bounds");
  if (w.in > INT32_MAX || T > INT32_MAX || ldy > INT32_MAX) return internal_error("gemm: shape exceeds cuBLAS int");
  AFF_ASSIGN_OR_RETURN(GemmContext * ctx, gemm_context(stream));
  std::lock_guard<std::mutex> lock(ctx->mu);
  const bool split = precision == MmaPrecision::kBf16x3;
  const int64_t tile_rows = std::min(rows, std::max<int64_t>(128, kTileElems / w.in / 128 * 128));
  uint16_t* tile = nullptr;
  if (w.format != DevFormat::kBF16) {
    AFF_ASSIGN_OR_RETURN(void* p, gemm_scratch(*ctx, kBufWTile, size_t(tile_rows * w.in) * 2));
    tile = static_cast<uint16_t*>(p);
  }
  const uint16_t* xh = nullptr;
  const uint16_t* xl = nullptr;
  AFF_RETURN_IF_ERROR(gemm_input_bf16(*ctx, x, ldx, T, w.in, split, &xh, &xl, stream));
  for (int64_t r0 = row_begin; r0 < row_end; r0 += tile_rows) {
    const int64_t n = std::min(tile_rows, row_end - r0);
    // BF16 weights are multiplied in place; the others are decoded into the tile.
    const uint16_t* wt = reinterpret_cast<const uint16_t*>(w.weight) + r0 * w.in;
    if (tile != nullptr) {
      AFF_RETURN_IF_ERROR(dequant_rows_bf16(w, r0, n, tile, stream));
      wt = tile;
    }
    AFF_RETURN_IF_ERROR(gemm_bf16_f32(*ctx, n, T, w.in, wt, xh, xl, w.in, y + (r0 - row_begin), ldy));
  }
  return Status::ok();
}

Status gemm_grouped_rows_bf16(const DeviceLinear& w, int G, int64_t R, const float* x, int64_t ldx, int64_t T,
                              float* y, int64_t ldy, MmaPrecision precision, cudaStream_t stream) {
  if (T <= 0 || G <= 0 || R <= 0) return Status::ok();
  const int64_t K = w.in, in_all = int64_t(G) * K;
  if (w.out != G * R || ldx < in_all || ldy < G * R) return internal_error("gemm: grouped rows out of bounds");
  // A weight too large for one decoded tile (or stored as bf16, multiplied in
  // place) keeps the per-group calls; V4's wo_a (8 x 1024 x 4096) is one tile.
  if (w.format == DevFormat::kBF16 || w.out * K > kTileElems) {
    for (int g = 0; g < G; ++g)
      AFF_RETURN_IF_ERROR(
          gemm_rows_bf16(w, g * R, (g + 1) * R, x + g * K, ldx, T, y + g * R, ldy, precision, stream));
    return Status::ok();
  }
  if (!gemm_supports(w, precision))
    return unsupported("gemm: weight format has no tensor-core path at this precision on the GPU");
  if (in_all > INT32_MAX || T > INT32_MAX || ldy > INT32_MAX || R > INT32_MAX)
    return internal_error("gemm: shape exceeds cuBLAS int");
  AFF_ASSIGN_OR_RETURN(GemmContext * ctx, gemm_context(stream));
  std::lock_guard<std::mutex> lock(ctx->mu);
  const bool split = precision == MmaPrecision::kBf16x3;
  AFF_ASSIGN_OR_RETURN(void* tile, gemm_scratch(*ctx, kBufWTile, size_t(w.out * K) * 2));
  const uint16_t* xh = nullptr;
  const uint16_t* xl = nullptr;
  AFF_RETURN_IF_ERROR(gemm_input_bf16(*ctx, x, ldx, T, in_all, split, &xh, &xl, stream));
  AFF_RETURN_IF_ERROR(dequant_rows_bf16(w, 0, w.out, static_cast<uint16_t*>(tile), stream));
  const float one = 1.0f, zero = 0.0f;
  // Column-major as in gemm_bf16_f32, batch g: y_g^T [R, T] = W_g [K, R]^T x_g^T [K, T];
  // W_g starts R*K elements after W_{g-1}, x_g K columns after x_{g-1}, y_g R after y_{g-1}.
  for (int pass = 0; pass < (split ? 2 : 1); ++pass) {
    AFF_RETURN_IF_ERROR(cublas_status(
        cublasGemmStridedBatchedEx(ctx->handle, CUBLAS_OP_T, CUBLAS_OP_N, int(R), int(T), int(K), &one, tile,
                                   CUDA_R_16BF, int(K), R * K, pass == 0 ? xh : xl, CUDA_R_16BF, int(in_all), K,
                                   pass == 0 ? &zero : &one, y, CUDA_R_32F, int(ldy), R, G, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT),
        "cublasGemmStridedBatchedEx"));
  }
  return Status::ok();
}

}  // namespace aff::cuda
