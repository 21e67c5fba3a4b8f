// Device-side decoding of the stored element types. Bit layouts match
// src/core/dtype.h (the host's single home of them); decoding is exact.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/runtime/device_weights.h"

namespace aff::cuda {

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t h) { return __uint_as_float(uint32_t(h) << 16); }

__device__ __forceinline__ float f16_bits_to_f32(uint16_t h) {
  return __half2float(__ushort_as_half(h));
}

// OCP E4M3FN: bias 7, no infinities, 0x7F/0xFF NaN, exponent 0 subnormal (m * 2^-9).
__device__ __forceinline__ float e4m3_to_f32_dev(uint32_t b) {
  const uint32_t sign = (b & 0x80u) << 24;
  const uint32_t e = (b >> 3) & 0xFu, m = b & 7u;
  float v;
  if (e == 0) {
    v = float(m) * 0.001953125f;  // 2^-9
  } else if (e == 15 && m == 7) {
    return __uint_as_float(0x7fc00000u);
  } else {
    v = __uint_as_float(((e + 120u) << 23) | (m << 20));
  }
  return __uint_as_float(__float_as_uint(v) | sign);
}

// E8M0: 2^(e-127); 0 -> 2^-127 (denormal), 255 -> NaN.
__device__ __forceinline__ float e8m0_to_f32_dev(uint32_t e) {
  if (e == 0) return __uint_as_float(0x00400000u);
  if (e == 255) return __uint_as_float(0x7fc00000u);
  return __uint_as_float(e << 23);
}

// FP4 E2M1 code -> value: magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}.
__device__ __forceinline__ float e2m1_to_f32_dev(uint32_t c) {
  const uint32_t mag = c & 7u;
  // (mag < 2) subnormal: mag * 0.5; else (1 + m/2) * 2^(e-1) with e = mag >> 1, m = mag & 1.
  float v = mag < 2 ? 0.5f * float(mag) : float(2 + (mag & 1u)) * float(1u << ((mag >> 1) - 1)) * 0.5f;
  return (c & 8u) ? -v : v;
}

__device__ __forceinline__ float load_scale(const DeviceLinear& w, int64_t i) {
  switch (w.scale_type) {
    case DevScale::kE8M0: return e8m0_to_f32_dev(w.scale[i]);
    case DevScale::kF32: return reinterpret_cast<const float*>(w.scale)[i];
    case DevScale::kBF16: return bf16_bits_to_f32(reinterpret_cast<const uint16_t*>(w.scale)[i]);
    case DevScale::kF16: return f16_bits_to_f32(reinterpret_cast<const uint16_t*>(w.scale)[i]);
    default: return 1.0f;
  }
}

// 16 bytes of a weight that is read once per launch: through the
// non-coherent path and kept out of L1 (activations live there).
__device__ __forceinline__ uint4 ld_stream16(const uint8_t* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// Asynchronous global -> shared copies (cp.async): the bytes land in shared
// memory without passing through registers, so a warp can have many more in
// flight than its registers hold. A thread sees its own copies after
// cp_async_wait<N>() (at most N of its committed groups still pending).
__device__ __forceinline__ void cp_async8(void* dst, const void* src) {
  const unsigned d = unsigned(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(d), "l"(src) : "memory");
}
// 16 bytes through L2 only (.cg): weights read once per launch.
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  const unsigned d = unsigned(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { cp_async_wait<0>(); }

// The low two E4M3 bytes of v as an f16x2 (low byte in the low half), by the
// hardware conversion; exact, every E4M3 value is an f16.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t v) {
  const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v & 0xffffu), __NV_E4M3);
  return uint32_t(r.x) | (uint32_t(r.y) << 16);
}
// The high two E4M3 bytes of v, the same way: the conversion reads the
// register's upper half in place, where e4m3x2_to_f16x2(v >> 16) would spend
// a shift per call (16 per 128-byte column block of a GEMV warp).
__device__ __forceinline__ uint32_t e4m3x2_hi_to_f16x2(uint32_t v) {
  uint32_t r;
  asm("{\n\t.reg .b16 lo, hi;\n\tmov.b32 {lo, hi}, %1;\n\tcvt.rn.f16x2.e4m3x2 %0, hi;\n\t}" : "=r"(r) : "r"(v));
  return r;
}

// load_scale in two halves, so a kernel can issue the load early (with the
// weights it scales) and pay for the decode only where the value is used.
__device__ __forceinline__ uint32_t load_scale_raw(const DeviceLinear& w, int64_t i) {
  switch (w.scale_type) {
    case DevScale::kE8M0: return __ldg(w.scale + i);
    case DevScale::kF32: return __ldg(reinterpret_cast<const uint32_t*>(w.scale) + i);
    case DevScale::kBF16:
    case DevScale::kF16: return __ldg(reinterpret_cast<const uint16_t*>(w.scale) + i);
    default: return 0;
  }
}

__device__ __forceinline__ float decode_scale(const DeviceLinear& w, uint32_t raw) {
  switch (w.scale_type) {
    case DevScale::kE8M0: return e8m0_to_f32_dev(raw);
    case DevScale::kF32: return __uint_as_float(raw);
    case DevScale::kBF16: return bf16_bits_to_f32(uint16_t(raw));
    case DevScale::kF16: return f16_bits_to_f32(uint16_t(raw));
    default: return 1.0f;
  }
}

// 1 / rms of a row of n values from their sum of squares: the one formula
// every RMS norm of the forward pass uses (the reference's rsqrt(mean + eps),
// as an IEEE division of a square root so GPU and CPU round alike).
__device__ __forceinline__ float rms_inv(float sum_sq, float n, float eps) { return 1.0f / sqrtf(sum_sq / n + eps); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// One step of warp_sum_each: the lane keeps the half of v[0, 2 O) its lane
// bit O selects, and adds its partner's copy of that half.
template <int O>
__device__ __forceinline__ void warp_sum_halve(float (&v)[32], int lane) {
  const bool upper = (lane & O) != 0;
#pragma unroll
  for (int i = 0; i < O; ++i) {
    const float keep = upper ? v[i + O] : v[i], send = upper ? v[i] : v[i + O];
    v[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
  }
}

// 32 values summed over the warp at once: lane l returns the sum of v[l]
// over the lanes (31 shuffles, against 5 per value for warp_sum).
__device__ __forceinline__ float warp_sum_each(float (&v)[32]) {
  const int lane = threadIdx.x & 31;
  warp_sum_halve<16>(v, lane);
  warp_sum_halve<8>(v, lane);
  warp_sum_halve<4>(v, lane);
  warp_sum_halve<2>(v, lane);
  warp_sum_halve<1>(v, lane);
  return v[0];
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

}  // namespace aff::cuda
