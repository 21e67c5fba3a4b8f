// One warp computes the dot products of one weight row with up to kTokTile
// activation rows, decoding the stored format on the fly (f32 accumulate).
// Shared by the dense GEMV and the expert kernels so every format is decoded
// by exactly one piece of code.
//
// Each lane reads 16 bytes of the row per step when the row length allows it
// (coalesced 512-byte warp reads), else one element per lane per step.
#pragma once

#include <cuda_fp16.h>

#include "backend/cuda/kernels/common/decode.cuh"
#include "backend/cuda/kernels/common/ggml_decode.cuh"

namespace aff::cuda {

constexpr int kTokTile = 4;  // activation rows sharing one pass over a weight row

template <DevFormat F>
struct VecTraits;
template <>
struct VecTraits<DevFormat::kFP8Block> { static constexpr int kElems = 16; };
template <>
struct VecTraits<DevFormat::kMXFP4> { static constexpr int kElems = 32; };
template <>
struct VecTraits<DevFormat::kBF16> { static constexpr int kElems = 8; };
template <>
struct VecTraits<DevFormat::kF16> { static constexpr int kElems = 8; };
template <>
struct VecTraits<DevFormat::kF32> { static constexpr int kElems = 4; };
template <>
struct VecTraits<DevFormat::kGgml> { static constexpr int kElems = 32; };  // one ggml chunk
template <>
struct VecTraits<DevFormat::kQ8> { static constexpr int kElems = 16; };  // half a scale group

// True when rows can be read in 16-byte steps (row starts stay 16-byte aligned
// because the arena aligns every tensor to 256 bytes).
template <DevFormat F>
__device__ __forceinline__ bool vec_ok(const DeviceLinear& w) {
  if constexpr (F == DevFormat::kFP8Block) return w.in % 16 == 0 && w.block % 16 == 0;
  else if constexpr (F == DevFormat::kGgml || F == DevFormat::kQ8) return true;  // rows are whole 32-element groups
  else return w.in % VecTraits<F>::kElems == 0;
}

// Element (row, col) of w as f32 (value(code) * scale).
template <DevFormat F>
__device__ __forceinline__ float decode_at(const DeviceLinear& w, int64_t row, int64_t col) {
  if constexpr (F == DevFormat::kF32) {
    return reinterpret_cast<const float*>(w.weight)[row * w.in + col];
  } else if constexpr (F == DevFormat::kBF16) {
    return bf16_bits_to_f32(reinterpret_cast<const uint16_t*>(w.weight)[row * w.in + col]);
  } else if constexpr (F == DevFormat::kF16) {
    return f16_bits_to_f32(reinterpret_cast<const uint16_t*>(w.weight)[row * w.in + col]);
  } else if constexpr (F == DevFormat::kFP8Block) {
    const float s = load_scale(w, (row / w.block) * w.scale_cols + col / w.block);
    return e4m3_to_f32_dev(w.weight[row * w.in + col]) * s;
  } else if constexpr (F == DevFormat::kQ8) {  // unused: kQ8 rows always take the vector path
    const float s = load_scale(w, row * w.scale_cols + col / 32);
    return float(int8_t(w.weight[row * w.in + q8_code_at(col)])) * s;
  } else if constexpr (F == DevFormat::kGgml) {  // unused: ggml rows always take the vector path
    float chunk[32];
    ggml_decode32(w, row, col / 32, chunk);
    return chunk[col % 32];
  } else {  // kMXFP4
    const uint8_t b = w.weight[row * (w.in / 2) + col / 2];
    const float s = load_scale(w, row * w.scale_cols + col / 32);
    return e2m1_to_f32_dev((col & 1) ? (b >> 4) : (b & 0xf)) * s;
  }
}

// The VecTraits<F>::kElems elements of row `row` from column c0 (16 bytes).
template <DevFormat F>
__device__ __forceinline__ void decode_vec(const DeviceLinear& w, int64_t row, int64_t c0, float* out) {
  if constexpr (F == DevFormat::kF32) {
    const float4 v = *reinterpret_cast<const float4*>(w.weight + (row * w.in + c0) * 4);
    out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
  } else if constexpr (F == DevFormat::kBF16 || F == DevFormat::kF16) {
    const uint4 v = *reinterpret_cast<const uint4*>(w.weight + (row * w.in + c0) * 2);
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (F == DevFormat::kBF16) {
        out[2 * i] = bf16_bits_to_f32(uint16_t(words[i] & 0xffffu));
        out[2 * i + 1] = bf16_bits_to_f32(uint16_t(words[i] >> 16));
      } else {
        out[2 * i] = f16_bits_to_f32(uint16_t(words[i] & 0xffffu));
        out[2 * i + 1] = f16_bits_to_f32(uint16_t(words[i] >> 16));
      }
    }
  } else if constexpr (F == DevFormat::kFP8Block) {
    const uint4 v = *reinterpret_cast<const uint4*>(w.weight + row * w.in + c0);
    const float s = load_scale(w, (row / w.block) * w.scale_cols + c0 / w.block);
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 16; ++i) out[i] = e4m3_to_f32_dev((words[i / 4] >> (8 * (i % 4))) & 0xffu) * s;
  } else if constexpr (F == DevFormat::kQ8) {  // columns [c0, c0 + 16): two runs of 8 codes
    const uint8_t* r = w.weight + row * w.in;
    const uint2 a = *reinterpret_cast<const uint2*>(r + q8_code_at(c0));
    const uint2 b = *reinterpret_cast<const uint2*>(r + q8_code_at(c0 + 8));
    const float s = load_scale(w, row * w.scale_cols + c0 / 32);
    const uint32_t words[4] = {a.x, a.y, b.x, b.y};
#pragma unroll
    for (int i = 0; i < 16; ++i) out[i] = float(int8_t((words[i / 4] >> (8 * (i % 4))) & 0xffu)) * s;
  } else if constexpr (F == DevFormat::kGgml) {
    ggml_decode32(w, row, c0 / 32, out);
  } else {  // kMXFP4: 16 bytes = 32 codes = exactly one scale group
    const uint4 v = *reinterpret_cast<const uint4*>(w.weight + row * (w.in / 2) + c0 / 2);
    const float s = load_scale(w, row * w.scale_cols + c0 / 32);
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 32; ++i) out[i] = e2m1_to_f32_dev((words[i / 8] >> (4 * (i % 8))) & 0xfu) * s;
  }
}

// acc[t] += sum over this lane's columns of W[row, c] * x[t * ldx + c], t < nt.
// The caller reduces acc across the warp.
template <DevFormat F>
__device__ __forceinline__ void row_dot_partial(const DeviceLinear& w, int64_t row, const float* x,
                                                int64_t ldx, int nt, float (&acc)[kTokTile]) {
  const int lane = threadIdx.x & 31;
  if (vec_ok<F>(w)) {
    constexpr int V = VecTraits<F>::kElems;
    for (int64_t c0 = int64_t(lane) * V; c0 < w.in; c0 += 32 * V) {
      float wv[V];
      decode_vec<F>(w, row, c0, wv);
#pragma unroll
      for (int t = 0; t < kTokTile; ++t) {
        if (t < nt) {
          const float* xt = x + t * ldx + c0;
          float s = 0.0f;
#pragma unroll
          for (int i = 0; i < V; ++i) s = fmaf(wv[i], xt[i], s);
          acc[t] += s;
        }
      }
    }
  } else {
    for (int64_t c = lane; c < w.in; c += 32) {
      const float wv = decode_at<F>(w, row, c);
#pragma unroll
      for (int t = 0; t < kTokTile; ++t)
        if (t < nt) acc[t] = fmaf(wv, x[t * ldx + c], acc[t]);
    }
  }
}

// The full dot of row `row` with one activation vector x, reduced over the warp
// (every lane gets the result).
template <DevFormat F>
__device__ __forceinline__ float row_dot1(const DeviceLinear& w, int64_t row, const float* x) {
  float acc[kTokTile] = {0.0f, 0.0f, 0.0f, 0.0f};
  row_dot_partial<F>(w, row, x, 0, 1, acc);
  return warp_sum(acc[0]);
}

}  // namespace aff::cuda
