// GEMV / skinny GEMM for every stored format: y = W x for T activation rows.
//
// gemv_any_f32_sm90<TT>: one kernel for every format (a uniform switch per row
// picks the decoder, see common/fast_dot.cuh). A block of W warps works on
// W/S rows at a time, S warps splitting each row's columns (split-K inside the
// block, reduced through shared memory in a fixed order, so results are
// deterministic); blocks stride over row groups. Tokens come in tiles of TT
// (grid.y), each weight chunk decoded once per tile. ggml formats stage the
// tile's activations as int8 in shared memory once per block, so their grid is
// capped at a few blocks per SM; native formats read f32 activations through L1.
//
// Byte budget per launch: the weight once per token tile (+ the activations
// once per block for ggml formats).
//
// gemv_<fmt>_f32_sm90 (warp per row, row_dot.cuh) remains as the fallback for
// ggml rows too long to stage in shared memory.
#include <algorithm>

#include "backend/cuda/kernels/common/fast_dot.cuh"
#include "backend/cuda/kernels/gemm/mma_precision.h"
#include "backend/cuda/kernels/gemv/gemv.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/smem_limit.h"
#include "backend/cuda/runtime/pdl.h"
#include "backend/cuda/runtime/device_info.h"

namespace aff::cuda {
namespace {

// ---- fallback: warp per row, 4-token tiles ---------------------------------------------

constexpr int kRowsPerBlock = 8;

struct GemvArgs {
  DeviceLinear w;
  int64_t row_begin, n_rows;
  const float* x;
  int64_t ldx, T;
  float* y;
  int64_t ldy;
};

template <DevFormat F>
__device__ __forceinline__ void gemv_body(const GemvArgs& a) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t r = int64_t(blockIdx.x) * kRowsPerBlock + warp;
  const int64_t t0 = int64_t(blockIdx.y) * kTokTile;
  if (r >= a.n_rows) return;
  const int nt = a.T - t0 < kTokTile ? int(a.T - t0) : kTokTile;
  float acc[kTokTile] = {0.0f, 0.0f, 0.0f, 0.0f};
  row_dot_partial<F>(a.w, a.row_begin + r, a.x + t0 * a.ldx, a.ldx, nt, acc);
#pragma unroll
  for (int t = 0; t < kTokTile; ++t) {
    const float v = warp_sum(acc[t]);
    if (lane == 0 && t < nt) a.y[(t0 + t) * a.ldy + r] = v;
  }
}

__global__ void __launch_bounds__(kRowsPerBlock * 32) gemv_ggml_f32_sm90(GemvArgs a) {
  pdl_start();  // runtime/pdl.h: nothing in this kernel runs before the wait
  gemv_body<DevFormat::kGgml>(a);
}

// ---- the fast kernel ---------------------------------------------------------------------

constexpr int kMaxWarps = 16;

struct FastArgs {
  DeviceLinear w;
  int64_t row_begin, n_rows;
  ActF32 x;       // token t at x.x + t*x.ld
  int64_t T;
  float* y;       // token t, row r at y[t*ldy + r]
  int64_t ldy;
  int split;      // S: warps per row (power of two dividing the block's warps)
  int64_t ring_at;  // ggml: byte offset of the per-warp rings in dynamic smem (< 0: none)
  int perm_v;       // native: stage x permuted for chunks of this many elements (0: read x from L1)
};

template <WPath P, int TT>
__global__ void __launch_bounds__(kMaxWarps * 32) gemv_any_f32_sm90(FastArgs a) {
  pdl_start();  // runtime/pdl.h: nothing in this kernel runs before the wait
  extern __shared__ __align__(16) uint8_t xs_smem[];
  __shared__ float red[kMaxWarps][TT];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, n_warps = blockDim.x >> 5;
  const int S = a.split, R = n_warps / S;
  const int part = warp % S, sub = warp / S;
  const int64_t t0 = int64_t(blockIdx.y) * TT;
  const int nt = a.T - t0 < TT ? int(a.T - t0) : TT;
  ActF32 x = a.x;
  x.x += t0 * x.ld;
  if (a.w.format == DevFormat::kGgml) {
    act_q8_stage(x.x, x.ld, nt, a.w.in, xs_smem);
    __syncthreads();
  } else if (a.perm_v > 0) {
    act_f32_stage_perm(x.x, x.ld, nt, a.w.in, a.perm_v, reinterpret_cast<float*>(xs_smem));
    x.perm = reinterpret_cast<const float*>(xs_smem), x.perm_ld = a.w.in;
    __syncthreads();
  }
  for (int64_t g = blockIdx.x; g * R < a.n_rows; g += gridDim.x) {
    const int64_t r = g * R + sub;
    float acc[TT];
#pragma unroll
    for (int t = 0; t < TT; ++t) acc[t] = 0.0f;
    uint8_t* ring = a.ring_at >= 0 ? xs_smem + a.ring_at + warp * kGgmlRingBytes : nullptr;
    if (r < a.n_rows) row_part_p<P, TT>(a.w, a.row_begin + r, x, xs_smem, nt, part, S, ring, acc);
#pragma unroll
    for (int t = 0; t < TT; ++t) acc[t] = warp_sum(acc[t]);
    if (S == 1) {
      if (lane == 0 && r < a.n_rows) {
#pragma unroll
        for (int t = 0; t < TT; ++t)
          if (t < nt) a.y[(t0 + t) * a.ldy + r] = acc[t];
      }
    } else {
      if (lane == 0) {
#pragma unroll
        for (int t = 0; t < TT; ++t) red[warp][t] = acc[t];
      }
      __syncthreads();
      if (part == 0 && lane < nt && r < a.n_rows) {
        float s = 0.0f;
        for (int p = 0; p < S; ++p) s += red[sub * S + p][lane];
        a.y[(t0 + lane) * a.ldy + r] = s;
      }
      __syncthreads();
    }
  }
}


constexpr int64_t kMaxStageBytes = 200 * 1024;
constexpr int64_t kMaxPermBytes = 64 * 1024;  // permuted f32 x per block (T * in * 4)

bool g_ggml_ring = true;
bool g_native_perm = false;  // not yet measured on the GPU: opt-in until it is

// Raises a kernel's dynamic shared memory limit once (before any graph capture:
// the first GEMV of a process runs eagerly).
template <WPath P, int TT>
Status allow_stage_smem() {
  static const Status s =
      raise_smem_limit(reinterpret_cast<const void*>(gemv_any_f32_sm90<P, TT>), int(kMaxStageBytes));
  return s;
}

// Elements one lane decodes per step (sets how many lanes a row can feed).
int64_t chunk_elems(const DeviceLinear& w) {
  switch (w.format) {
    case DevFormat::kFP8Block:
    case DevFormat::kQ8: return 16;
    case DevFormat::kMXFP4: return 32;
    case DevFormat::kBF16:
    case DevFormat::kF16: return 8;
    case DevFormat::kF32: return 4;
    case DevFormat::kGgml: return 32;
  }
  return 16;
}

template <WPath P, int TT>
Status launch_fast(const DeviceLinear& w, int64_t row_begin, int64_t n_rows, const float* x, int64_t ldx, int64_t T,
                   float* y, int64_t ldy, cudaStream_t stream) {
  const bool ggml = w.format == DevFormat::kGgml;
  const int n_warps = ggml ? 16 : 8;
  const int sms = current_device_multiprocessors();
  // Split rows across warps until the launch has about two waves of warps,
  // while every lane still gets four chunks (the loads it keeps in flight).
  const int64_t chunks = w.in / chunk_elems(w);
  int S = 1;
  while (S < n_warps && n_rows * S < int64_t(sms) * 64 * 2 && chunks >= int64_t(128) * S * 2) S *= 2;
  const int R = n_warps / S;
  const int64_t groups = (n_rows + R - 1) / R;
  const int nt_max = int(std::min<int64_t>(T, TT));
  // Native formats stage x permuted in shared memory when it fits in a share
  // that still lets several blocks per SM stream.
  const int64_t V = chunk_elems(w);
  const bool perm = g_native_perm && !ggml && w.format != DevFormat::kQ8 && w.in % (32 * V) == 0 && int64_t(nt_max) * w.in * 4 <= kMaxPermBytes;
  const int64_t stage = ggml ? act_q8_bytes(nt_max, w.in) : perm ? int64_t(nt_max) * w.in * 4 : 0;
  const int64_t rings = int64_t(n_warps) * kGgmlRingBytes;
  const bool ring = ggml && g_ggml_ring && stage + rings <= kMaxStageBytes;
  const size_t smem = size_t(stage + (ring ? rings : 0));
  if (smem > 48 * 1024) AFF_RETURN_IF_ERROR((allow_stage_smem<P, TT>()));
  // Staging blocks (ggml, permuted x) are capped so the copy is paid a few
  // hundred times per launch; others stride over rows with full occupancy.
  const int64_t cap = ggml ? int64_t(sms) * 2 : perm ? int64_t(sms) * 4 : int64_t(sms) * 16;
  const dim3 grid(unsigned(std::min(groups, cap)), unsigned((T + TT - 1) / TT));
  ActF32 xa{x, ldx, (reinterpret_cast<uintptr_t>(x) % 16 == 0) && (ldx % 4 == 0)};
  const FastArgs args{w, row_begin, n_rows, xa, T, y, ldy, S, ring ? stage : -1, perm ? int(V) : 0};
  return cuda_status(launch_pdl(gemv_any_f32_sm90<P, TT>, grid, dim3(n_warps * 32), smem, stream, args),
                     "gemv_any_f32_sm90");
}

template <int TT>
Status launch_path(const DeviceLinear& w, int64_t row_begin, int64_t n_rows, const float* x, int64_t ldx, int64_t T,
                   float* y, int64_t ldy, cudaStream_t stream) {
#define AFF_GEMV_PATH(P_) \
  case WPath::P_: return launch_fast<WPath::P_, TT>(w, row_begin, n_rows, x, ldx, T, y, ldy, stream);
  switch (wpath_of(w.format, w.ggml_type)) {
    AFF_GEMV_PATH(kFP8)
    AFF_GEMV_PATH(kMXFP4)
    AFF_GEMV_PATH(kBF16)
    AFF_GEMV_PATH(kF16)
    AFF_GEMV_PATH(kF32)
    AFF_GEMV_PATH(kQ8)
    AFF_GEMV_PATH(kQ8_0)
    AFF_GEMV_PATH(kQ2_K)
    AFF_GEMV_PATH(kQ3_K)
    AFF_GEMV_PATH(kQ4_K)
    AFF_GEMV_PATH(kIQ2_XXS)
    AFF_GEMV_PATH(kIQ4_XS)
    AFF_GEMV_PATH(kIQ4_NL)
    AFF_GEMV_PATH(kMXFP4g)
    AFF_GEMV_PATH(kGgmlOther)
    case WPath::kAny: break;
  }
#undef AFF_GEMV_PATH
  return internal_error("gemv: no kernel for this weight format");
}

}  // namespace

Status gemv_prepare() {
#define AFF_GEMV_PREPARE(P_)                                        \
  AFF_RETURN_IF_ERROR((allow_stage_smem<WPath::P_, 1>())); \
  AFF_RETURN_IF_ERROR((allow_stage_smem<WPath::P_, 8>()));
  AFF_GEMV_PREPARE(kFP8)
  AFF_GEMV_PREPARE(kMXFP4)
  AFF_GEMV_PREPARE(kBF16)
  AFF_GEMV_PREPARE(kF16)
  AFF_GEMV_PREPARE(kF32)
  AFF_GEMV_PREPARE(kQ8)
  AFF_GEMV_PREPARE(kQ8_0)
  AFF_GEMV_PREPARE(kQ2_K)
  AFF_GEMV_PREPARE(kQ3_K)
  AFF_GEMV_PREPARE(kQ4_K)
  AFF_GEMV_PREPARE(kIQ2_XXS)
  AFF_GEMV_PREPARE(kIQ4_XS)
  AFF_GEMV_PREPARE(kIQ4_NL)
  AFF_GEMV_PREPARE(kMXFP4g)
  AFF_GEMV_PREPARE(kGgmlOther)
#undef AFF_GEMV_PREPARE
  return gemv_mma_prepare();
}

void gemv_set_ggml_ring(bool on) { g_ggml_ring = on; }
void gemv_set_native_perm(bool on) { g_native_perm = on; }

Status gemv_rows_f32(const DeviceLinear& w, int64_t row_begin, int64_t row_end, const float* x,
                     int64_t ldx, int64_t T, float* y, int64_t ldy, cudaStream_t stream) {
  if (row_begin < 0 || row_begin > row_end || row_end > w.out)
    return internal_error("gemv: row range outside the weight");
  const int64_t n_rows = row_end - row_begin;
  if (n_rows == 0 || T == 0) return Status::ok();
  const int64_t tiles = T == 1 ? 1 : (T + 7) / 8;
  if (tiles > 65535) return internal_error("gemv: too many tokens in one launch");
  const bool ggml = w.format == DevFormat::kGgml;
  if (ggml && act_q8_bytes(std::min<int64_t>(T, 8), w.in) > kMaxStageBytes) {
    // Rows too long to stage 8 tokens: the warp-per-row kernel with f32 activations.
    const dim3 grid(unsigned((n_rows + kRowsPerBlock - 1) / kRowsPerBlock), unsigned((T + kTokTile - 1) / kTokTile));
    if (grid.y > 65535u) return internal_error("gemv: too many tokens in one launch");
    const cudaError_t e = launch_pdl(gemv_ggml_f32_sm90, grid, dim3(kRowsPerBlock * 32), 0, stream,
                                           GemvArgs{w, row_begin, n_rows, x, ldx, T, y, ldy});
    return cuda_status(e, "gemv_ggml_f32_sm90");
  }
  // FP8 block-scaled and BF16 rows: tensor-core GEMV (gemv_mma.cu), both precisions.
  const int64_t whole = (w.out + 15) / 16 * 16;
  if (gemv_mma_takes(w, row_begin, whole))
    return gemv_mma(w, row_begin, row_end, x, ldx, T, y, ldy, whole, 0, stream);
  if (T == 1) return launch_path<1>(w, row_begin, n_rows, x, ldx, T, y, ldy, stream);
  return launch_path<8>(w, row_begin, n_rows, x, ldx, T, y, ldy, stream);
}

}  // namespace aff::cuda
