// dequant_rows_bf16_sm90: thread per 8 consecutive elements of a row; values
// are decoded exactly as the GEMV does (element = code x block scale) and
// rounded once to bf16, which is exact for E4M3 x E8M0 and E2M1 x E8M0 (the
// products have at most 4 significant bits). split_rows_bf16_sm90: f32
// activations to bf16 hi (+ lo = the rounding remainder).
#include "backend/cuda/kernels/common/decode.cuh"
#include "backend/cuda/kernels/common/ggml_decode.cuh"
#include "backend/cuda/kernels/gemm/gemm.h"
#include "backend/cuda/kernels/gemm/mma_bf16.cuh"
#include "backend/cuda/runtime/cuda_check.h"

namespace aff::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kPerThread = 8;

__device__ __forceinline__ float element(const DeviceLinear& w, int64_t row, int64_t col) {
  switch (w.format) {
    case DevFormat::kF32: return reinterpret_cast<const float*>(w.weight)[row * w.in + col];
    case DevFormat::kBF16: return bf16_bits_to_f32(reinterpret_cast<const uint16_t*>(w.weight)[row * w.in + col]);
    case DevFormat::kF16: return f16_bits_to_f32(reinterpret_cast<const uint16_t*>(w.weight)[row * w.in + col]);
    case DevFormat::kFP8Block:
      return e4m3_to_f32_dev(w.weight[row * w.in + col]) *
             load_scale(w, (row / w.block) * w.scale_cols + col / w.block);
    case DevFormat::kMXFP4: {
      const uint32_t byte = w.weight[row * (w.in / 2) + col / 2];
      return e2m1_to_f32_dev((col & 1) ? byte >> 4 : byte & 15u) * load_scale(w, row * w.scale_cols + col / 32);
    }
    case DevFormat::kQ8:
      return float(int8_t(w.weight[row * w.in + q8_code_at(col)])) * load_scale(w, row * w.scale_cols + col / 32);
    default: return 0.0f;
  }
}

__global__ void __launch_bounds__(kThreads) dequant_rows_bf16_sm90(DeviceLinear w, int64_t row_begin, int64_t n_rows,
                                                                   uint16_t* dst) {
  const int64_t per_row = (w.in + kPerThread - 1) / kPerThread;
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n_rows * per_row) return;
  const int64_t r = i / per_row, c0 = (i % per_row) * kPerThread;
  const int64_t row = row_begin + r;
  uint16_t* d = dst + r * w.in;
#pragma unroll
  for (int k = 0; k < kPerThread; ++k)
    if (c0 + k < w.in) d[c0 + k] = bf16_bits(element(w, row, c0 + k));
}

__global__ void __launch_bounds__(kThreads) split_rows_bf16_sm90(const float* x, int64_t ldx, int64_t T, int64_t in,
                                                                 uint16_t* hi, uint16_t* lo) {
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= T * in) return;
  const int64_t t = i / in, c = i % in;
  uint16_t h, l;
  split_bf16(x[t * ldx + c], h, l);
  hi[i] = h;
  if (lo != nullptr) lo[i] = l;
}

// The same for 4 consecutive elements per thread (in, ldx multiples of 4, x 16-byte
// aligned): one 16-byte load and 8-byte stores, and the row found once per 4.
__global__ void __launch_bounds__(kThreads) split_rows4_bf16_sm90(const float* x, int64_t ldx, int64_t T, int64_t in,
                                                                  uint16_t* hi, uint16_t* lo) {
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;  // quad index
  const int64_t quads = in / 4;
  if (i >= T * quads) return;
  const int64_t t = i / quads, c = (i % quads) * 4;
  const float4 v = *reinterpret_cast<const float4*>(x + t * ldx + c);
  uint2 h, l;
  split4_bf16(v, h, l);
  reinterpret_cast<uint2*>(hi)[i] = h;
  if (lo != nullptr) reinterpret_cast<uint2*>(lo)[i] = l;
}

// FP8 block: 16 codes (16 bytes) per thread share one scale (16 | block).
__global__ void __launch_bounds__(kThreads) dequant_fp8_bf16_sm90(DeviceLinear w, int64_t row_begin, int64_t n_rows,
                                                                  uint16_t* dst) {
  const int64_t per_row = w.in / 16;
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n_rows * per_row) return;
  const int64_t r = i / per_row, c0 = (i % per_row) * 16, row = row_begin + r;
  const uint4 codes = __ldg(reinterpret_cast<const uint4*>(w.weight + row * w.in + c0));
  const float s = load_scale(w, (row / w.block) * w.scale_cols + c0 / w.block);
  const uint32_t words[4] = {codes.x, codes.y, codes.z, codes.w};
  uint32_t packed[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const uint32_t word = words[k / 2], sh = (k % 2) * 16;
    const float lo = e4m3_to_f32_dev((word >> sh) & 255u) * s, hi = e4m3_to_f32_dev((word >> (sh + 8)) & 255u) * s;
    packed[k] = uint32_t(bf16_bits(lo)) | uint32_t(bf16_bits(hi)) << 16;
  }
  uint4* d = reinterpret_cast<uint4*>(dst + r * w.in + c0);
  d[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  d[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
}

// MXFP4: 16 bytes = 32 codes = one scale group per thread.
__global__ void __launch_bounds__(kThreads) dequant_mxfp4_bf16_sm90(DeviceLinear w, int64_t row_begin, int64_t n_rows,
                                                                    uint16_t* dst) {
  const int64_t per_row = w.in / 32;
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n_rows * per_row) return;
  const int64_t r = i / per_row, g = i % per_row, row = row_begin + r;
  const uint4 codes = __ldg(reinterpret_cast<const uint4*>(w.weight + row * (w.in / 2) + g * 16));
  const float s = load_scale(w, row * w.scale_cols + g);
  const uint32_t words[4] = {codes.x, codes.y, codes.z, codes.w};
  uint32_t packed[16];
#pragma unroll
  for (int k = 0; k < 16; ++k) {  // byte k holds columns 2k (low nibble) and 2k+1
    const uint32_t byte = (words[k / 4] >> ((k % 4) * 8)) & 255u;
    packed[k] = uint32_t(bf16_bits(e2m1_to_f32_dev(byte & 15u) * s)) |
                uint32_t(bf16_bits(e2m1_to_f32_dev(byte >> 4) * s)) << 16;
  }
  uint4* d = reinterpret_cast<uint4*>(dst + r * w.in + g * 32);
#pragma unroll
  for (int k = 0; k < 4; ++k) d[k] = make_uint4(packed[4 * k], packed[4 * k + 1], packed[4 * k + 2], packed[4 * k + 3]);
}

// ggml blocks: thread per 32-element chunk of a row, decoded as the GEMV does
// (ggml_decode.cuh) and rounded to bf16 (not exact: ggml values are f16 scale
// x small integers, so these formats take the GEMM only in kBf16).
__global__ void __launch_bounds__(kThreads) dequant_ggml_bf16_sm90(DeviceLinear w, int64_t row_begin, int64_t n_rows,
                                                                  uint16_t* dst) {
  const int64_t per_row = w.in / 32;
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n_rows * per_row) return;
  const int64_t r = i / per_row, ch = i % per_row;
  float v[32];
  ggml_decode32(w, row_begin + r, ch, v);
  uint4* d = reinterpret_cast<uint4*>(dst + r * w.in + ch * 32);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    uint32_t q[4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
      q[j] = uint32_t(bf16_bits(v[8 * k + 2 * j])) | uint32_t(bf16_bits(v[8 * k + 2 * j + 1])) << 16;
    d[k] = make_uint4(q[0], q[1], q[2], q[3]);
  }
}

}  // namespace

bool gemm_supports(const DeviceLinear& w, MmaPrecision precision) {
  switch (w.format) {
    case DevFormat::kF32:
    case DevFormat::kF16: return precision == MmaPrecision::kBf16;
    case DevFormat::kBF16:
    case DevFormat::kFP8Block: return true;
    case DevFormat::kMXFP4: return w.in % 32 == 0;
    // ggml blocks round to bf16 (~2^-9 per weight), in either setting: no
    // path is exact for them (their GEMV quantises x to int8 per 32), and the
    // per-pair GEMV they fell back to made prefill ~50x slower.
    case DevFormat::kGgml: return w.in % 32 == 0 && w.tables != nullptr;
    case DevFormat::kQ8: return w.in % 32 == 0;  // rounds to bf16 as the ggml Q8_0 blocks do
    default: return false;
  }
}

Status dequant_rows_bf16(const DeviceLinear& w, int64_t row_begin, int64_t n_rows, uint16_t* dst,
                         cudaStream_t stream) {
  if (n_rows <= 0 || w.in <= 0) return Status::ok();
  if (!gemm_supports(w, MmaPrecision::kBf16)) return unsupported("dequant_rows_bf16: weight format has no bf16 decoder on the GPU");
  const bool aligned16 = reinterpret_cast<uintptr_t>(w.weight) % 16 == 0;
  if (w.format == DevFormat::kFP8Block && aligned16 && w.in % 16 == 0 && w.block % 16 == 0) {
    const int64_t n = n_rows * (w.in / 16);
    dequant_fp8_bf16_sm90<<<unsigned((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(w, row_begin, n_rows, dst);
    return launch_status("dequant_fp8_bf16_sm90");
  }
  if (w.format == DevFormat::kMXFP4 && aligned16) {
    const int64_t n = n_rows * (w.in / 32);
    dequant_mxfp4_bf16_sm90<<<unsigned((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(w, row_begin, n_rows, dst);
    return launch_status("dequant_mxfp4_bf16_sm90");
  }
  if (w.format == DevFormat::kGgml) {
    const int64_t n = n_rows * (w.in / 32);
    dequant_ggml_bf16_sm90<<<unsigned((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(w, row_begin, n_rows, dst);
    return launch_status("dequant_ggml_bf16_sm90");
  }
  const int64_t n = n_rows * ((w.in + kPerThread - 1) / kPerThread);
  dequant_rows_bf16_sm90<<<unsigned((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(w, row_begin, n_rows, dst);
  return launch_status("dequant_rows_bf16_sm90");
}

Status split_rows_bf16(const float* x, int64_t ldx, int64_t T, int64_t in, uint16_t* hi, uint16_t* lo,
                       cudaStream_t stream) {
  if (T <= 0 || in <= 0) return Status::ok();
  const bool quads = in % 4 == 0 && ldx % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(hi) % 8 == 0 && reinterpret_cast<uintptr_t>(lo) % 8 == 0;
  if (quads) {
    const int64_t n = T * (in / 4);
    split_rows4_bf16_sm90<<<unsigned((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(x, ldx, T, in, hi, lo);
    return launch_status("split_rows4_bf16_sm90");
  }
  const int64_t n = T * in;
  split_rows_bf16_sm90<<<unsigned((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(x, ldx, T, in, hi, lo);
  return launch_status("split_rows_bf16_sm90");
}

}  // namespace aff::cuda
