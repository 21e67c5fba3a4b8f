// Warp-level bf16 tensor-core helpers (mma.sync m16n8k16, f32 accumulation)
// shared by the attention, indexer and GEMM kernels.
//
// Fragment layout of m16n8k16 (lane = 4*g + c, g = lane / 4, c = lane % 4):
//   A 16x16 row-major: a[0] = (g, 2c..2c+1), a[1] = (g+8, 2c..), a[2] = (g, 2c+8..), a[3] = (g+8, 2c+8..)
//   B 16x8 (k x n):    b[0] = (k 2c..2c+1, n g), b[1] = (k 2c+8..2c+9, n g)
//   C 16x8 row-major:  c[0..1] = (g, 2c..2c+1), c[2..3] = (g+8, 2c..2c+1)
// A register holds two bf16 with the lower column (or k) in its low half, so a
// 32-bit load from a row-major bf16 array yields a fragment register directly.
//
// "Split" values carry an f32 as hi + lo bf16 (hi = rn(x), lo = rn(x - hi)):
// hi*hi + hi*lo + lo*hi recovers ~16 mantissa bits, enough to agree with an
// f32 reference to ~1e-5 at three times the MMA work.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace aff::cuda {

__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The same shape on f16 operands (same fragment layout): used where the A
// operand comes from a hardware conversion to f16 (FP8 E4M3 weights).
__device__ __forceinline__ void mma_f16_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// B fragment of a 16x8 (k x n) tile stored row-major by k (row = k, stride in
// bytes a multiple of 16): lanes 0..15 give the addresses of rows k0..k0+15 at
// column n0.
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t& b0, uint32_t& b1, const void* row_ptr) {
  const uint32_t addr = uint32_t(__cvta_generic_to_shared(row_ptr));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n" : "=r"(b0), "=r"(b1) : "r"(addr));
}

__device__ __forceinline__ uint16_t bf16_bits(float x) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

// x -> (hi, lo) bf16 bit patterns with hi + lo ~= x.
__device__ __forceinline__ void split_bf16(float x, uint16_t& hi, uint16_t& lo) {
  const __nv_bfloat16 h = __float2bfloat16_rn(x);
  hi = __bfloat16_as_ushort(h);
  lo = bf16_bits(x - __bfloat162float(h));
}

// Four values -> (hi, lo) bf16 pairs packed in element order (v.x in the low
// half of hi.x), with split_bf16's roundings; a pair goes through one packed
// conversion (fewer instructions where staging is much of a kernel's work).
__device__ __forceinline__ void split4_bf16(float4 v, uint2& hi, uint2& lo) {
  auto bits = [](__nv_bfloat162 h) { return *reinterpret_cast<const uint32_t*>(&h); };
  const __nv_bfloat162 h01 = __floats2bfloat162_rn(v.x, v.y), h23 = __floats2bfloat162_rn(v.z, v.w);
  const float2 f01 = __bfloat1622float2(h01), f23 = __bfloat1622float2(h23);
  hi = make_uint2(bits(h01), bits(h23));
  lo = make_uint2(bits(__floats2bfloat162_rn(v.x - f01.x, v.y - f01.y)),
                  bits(__floats2bfloat162_rn(v.z - f23.x, v.w - f23.y)));
}

// Stores 4 f32 as bf16 at hi[0..3] (and the remainders at lo[0..3] when
// kSplit), both 8-byte aligned.
template <bool kSplit>
__device__ __forceinline__ void store4_bf16(uint16_t* hi, uint16_t* lo, float4 v) {
  uint2 h, l;
  split4_bf16(v, h, l);
  *reinterpret_cast<uint2*>(hi) = h;
  if (kSplit) *reinterpret_cast<uint2*>(lo) = l;
}

__device__ __forceinline__ uint32_t ld_u32(const uint16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// A fragment from a row-major bf16 tile: rows r0..r0+15, columns k0..k0+15.
__device__ __forceinline__ void load_a_frag(uint32_t (&a)[4], const uint16_t* tile, int ld, int r0, int k0,
                                            int lane) {
  const int g = lane >> 2, c = lane & 3;
  const uint16_t* p = tile + (r0 + g) * ld + k0 + 2 * c;
  a[0] = ld_u32(p);
  a[1] = ld_u32(p + 8 * ld);
  a[2] = ld_u32(p + 8);
  a[3] = ld_u32(p + 8 * ld + 8);
}

// B fragment (k x n = 16 x 8) from a tile stored row-major by n (row = n,
// column = k, i.e. the "col" operand): rows n0..n0+7, columns k0..k0+15.
__device__ __forceinline__ void load_b_frag_nk(uint32_t& b0, uint32_t& b1, const uint16_t* tile, int ld, int n0,
                                               int k0, int lane) {
  const int g = lane >> 2, c = lane & 3;
  const uint16_t* p = tile + (n0 + g) * ld + k0 + 2 * c;
  b0 = ld_u32(p);
  b1 = ld_u32(p + 8);
}

}  // namespace aff::cuda
