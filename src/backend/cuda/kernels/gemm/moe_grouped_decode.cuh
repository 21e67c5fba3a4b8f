// ggml -> bf16 chunk decoders of the fused grouped expert kernels
// (moe_grouped_ggml.cu): 32 elements (chunk j of a super-block whose bytes
// are at b, in shared memory) to 16 bf16x2 words, o[i] = bf16(element 2i) |
// bf16(element 2i + 1) << 16.
//
// Why not ggml_decode32_at + a rounding per element: Hopper runs int <-> float
// conversions (I2F, F2F) at 16 per SM and clock, 1/8 of the f32 rate, and that
// path needs one I2F per element and one F2F per two, which would make the
// decode, not the tensor cores, the limit. Q2_K, Q3_K and IQ2_XXS have few
// distinct values per scale (4, 8 and 3 x sign), so each (sub-)block's values
// are computed in f32 and rounded to bf16 once, and every element pair picks
// its two bf16 values from them with one byte permute (prmt). The products
// are exact in f32 (f16 scale x small integers: at most 22 significant bits)
// and Q2_K's one subtraction of the min is rounded once, so each f32 value
// equals the reference decoder's whether or not a compiler fuses its
// multiply-add, and the words equal bf16_rn of the reference values bit for bit.
//
// The functions are __host__ __device__ so the test can hold them to the CPU
// reference decoders without a GPU. Their loops have constant trip counts and
// are fully unrolled by nvcc (no unroll pragmas: a host compiler warns on them).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#if defined(__CUDA_ARCH__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace aff::cuda::moe_grouped {

// prmt.b32, default mode: byte i of the result is byte (s >> 4i) & 7 of the
// pair (a = bytes 0..3, b = bytes 4..7); when bit 3 of that nibble is set, the
// sign bit of that byte replicated over 8 bits. Only s[15:0] is read.
__host__ __device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t s) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(s));
  return r;
#else
  const uint64_t x = uint64_t(a) | (uint64_t(b) << 32);
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t n = (s >> (4 * i)) & 0xfu;
    uint32_t byte = uint32_t(x >> (8 * (n & 7u))) & 0xffu;
    if (n & 8u) byte = (byte & 0x80u) ? 0xffu : 0u;
    r |= byte << (8 * i);
  }
  return r;
#endif
}

__host__ __device__ __forceinline__ float bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// bf16 round-to-nearest-even of lo and hi packed (lo in the low half).
__host__ __device__ __forceinline__ uint32_t bf16x2_rn(float lo, float hi) {
#if defined(__CUDA_ARCH__)
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
#else
  auto rn = [](float f) -> uint32_t {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;  // NaN
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  };
  return rn(lo) | (rn(hi) << 16);
#endif
}

// f16 bits -> f32 (exact).
__host__ __device__ __forceinline__ float f16_f32(uint32_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(uint16_t(h)));
#else
  const uint32_t s = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1fu) return bits_f32(s | 0x7f800000u | (m << 13));
  if (e != 0) return bits_f32(s | ((e + 112u) << 23) | (m << 13));
  const float v = float(m) * (1.0f / 16777216.0f);  // subnormal: m * 2^-24
  return s ? -v : v;
#endif
}

// A small non-negative integer (< 2^23) as f32 without a conversion
// instruction: the bits of 2^23 + v, minus 2^23 (exact).
__host__ __device__ __forceinline__ float small_f32(uint32_t v) { return bits_f32(0x4b000000u | v) - 8388608.0f; }

__host__ __device__ __forceinline__ uint32_t ld_u16(const uint8_t* p) {
  return *reinterpret_cast<const uint16_t*>(p);
}
// u32 at a 4-byte aligned address.
__host__ __device__ __forceinline__ uint32_t ld_u32_a4(const uint8_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}
// u32 at a 2-byte aligned address.
__host__ __device__ __forceinline__ uint32_t ld_u32_a2(const uint8_t* p) { return ld_u16(p) | (ld_u16(p + 2) << 16); }

// Selector of prmt for code bytes q_k (0..3 each, one per byte): byte k of the
// result is 0x22 q_k + 0x10, i.e. the nibbles 2 q_k and 2 q_k + 1, which pick
// bf16 value q_k of the table {lo, hi} = values 0, 1 | 2, 3. The low 16 bits
// serve elements 0 and 1 of q, the high 16 bits (shifted down) elements 2, 3.
// No byte carries into the next: 0x22 * 3 + 0x10 = 0x76.
__host__ __device__ __forceinline__ uint32_t pick_selector(uint32_t q) { return q * 0x22u + 0x10101010u; }

// ---- Q2_K: 84 bytes = scales[16] (4-bit scale | 4-bit min << 4), qs[64], f16 d, f16 dmin.
// Element f of sub-block f / 16 is dl q - ml, q = 2 bits of qs[(f / 128) * 32 + f % 32]
// at shift 2 ((f % 128) / 32). b is 4-byte aligned (84-byte blocks).
__host__ __device__ __forceinline__ void q2k_chunk_bf16(const uint8_t* b, int j, uint32_t (&o)[16]) {
  const float d = f16_f32(ld_u16(b + 80)), dmin = f16_f32(ld_u16(b + 82));
  const uint8_t* qs = b + 16 + (j >> 2) * 32;
  const int shift = 2 * (j & 3);
  for (int h = 0; h < 2; ++h) {
    const uint32_t sc = b[2 * j + h];
    const float dl = d * small_f32(sc & 0xfu), ml = dmin * small_f32(sc >> 4);
    const uint32_t lo = bf16x2_rn(dl * 0.0f - ml, dl - ml);  // q = 0, 1 (0 * dl: the reference's sign of zero)
    const uint32_t hi = bf16x2_rn(2.0f * dl - ml, 3.0f * dl - ml);  // q = 2, 3
    for (int i = 0; i < 16; i += 4) {
      const uint32_t s = pick_selector((ld_u32_a4(qs + 16 * h + i) >> shift) & 0x03030303u);
      o[8 * h + i / 2] = prmt(lo, hi, s);
      o[8 * h + i / 2 + 1] = prmt(lo, hi, s >> 16);
    }
  }
}

// ---- Q3_K: 110 bytes = hmask[32], qs[64], scales[12] (6-bit, stored + 32), f16 d.
// Element f: low 2 bits as Q2_K, high bit = bit f / 32 of hmask[f % 32]; value
// dl (low - 4) with the high bit clear, dl low with it set. b is only 2-byte
// aligned (110-byte blocks).
__host__ __device__ __forceinline__ void q3k_chunk_bf16(const uint8_t* b, int j, uint32_t (&o)[16]) {
  const float d = f16_f32(ld_u16(b + 108));
  const uint8_t* qs = b + 32 + (j >> 2) * 32;
  const uint8_t* sc = b + 96;
  const int shift = 2 * (j & 3);
  for (int h = 0; h < 2; ++h) {
    const int si = 2 * j + h;
    const uint32_t low4 = si < 8 ? (sc[si] & 0x0fu) : (uint32_t(sc[si - 8]) >> 4);
    const uint32_t high2 = (uint32_t(sc[8 + (si & 3)]) >> (2 * (si >> 2))) & 3u;
    const float dl = d * (small_f32(low4 | (high2 << 4)) - 32.0f);
    // High bit clear: values -4..-1 (t0, t1); set: 0..3 (t2, t3).
    const uint32_t t0 = bf16x2_rn(-4.0f * dl, -3.0f * dl), t1 = bf16x2_rn(-2.0f * dl, -1.0f * dl);
    const uint32_t t2 = bf16x2_rn(0.0f * dl, dl), t3 = bf16x2_rn(2.0f * dl, 3.0f * dl);
    for (int i = 0; i < 16; i += 4) {
      const uint32_t s = pick_selector((ld_u32_a2(qs + 16 * h + i) >> shift) & 0x03030303u);
      // Bit j of each hmask byte to its bit 7; prmt's sign mode spreads it over a half.
      const uint32_t hm = ld_u32_a2(b + 16 * h + i) << (7 - j);
      const uint32_t m01 = prmt(hm, 0u, 0x9988u), m23 = prmt(hm, 0u, 0xbbaau);
      o[8 * h + i / 2] = (prmt(t0, t1, s) & ~m01) | (prmt(t2, t3, s) & m01);
      o[8 * h + i / 2 + 1] = (prmt(t0, t1, s >> 16) & ~m23) | (prmt(t2, t3, s >> 16) & m23);
    }
  }
}

// ---- IQ2_XXS: 66 bytes = f16 d, then per 32 elements a u32 of 4 grid indices
// and a u32 of 4 x 7-bit sign indices | 4-bit scale << 28. Element 8l + k of
// the chunk: db * grid[index l] byte k, negated where bit k of signs[sign l]
// is set; db = d (0.5 + scale) / 4. Grid bytes are 0x08, 0x19 or 0x2b, so a
// chunk has 3 magnitudes. Per-block tables (built by the kernel from ggml's):
//   sel[g]   (256): prmt selectors of grid entry g, bytes 0..3 and 4..7;
//   sign[s]  (128): XOR masks (bit 15 / 31 of a word) of sign entry s, per element pair.
__host__ __device__ __forceinline__ uint2 iq2xxs_selectors(uint64_t grid) {
  uint32_t w[2];
  for (int half = 0; half < 2; ++half) {
    const uint32_t g = uint32_t(grid >> (32 * half));
    w[half] = pick_selector((g >> 4) & 0x0f0f0f0fu);  // 0x08 -> 0, 0x19 -> 1, 0x2b -> 2
  }
  return make_uint2(w[0], w[1]);
}

__host__ __device__ __forceinline__ uint4 iq2xxs_sign_masks(uint32_t signs) {
  uint32_t m[4];
  for (int p = 0; p < 4; ++p) m[p] = (((signs >> (2 * p)) & 1u) << 15) | (((signs >> (2 * p + 1)) & 1u) << 31);
  return make_uint4(m[0], m[1], m[2], m[3]);
}

__host__ __device__ __forceinline__ void iq2xxs_chunk_bf16(const uint8_t* b, int j, const uint2* sel,
                                                           const uint4* sign, uint32_t (&o)[16]) {
  const float d = f16_f32(ld_u16(b));
  const uint32_t grid_idx = ld_u32_a2(b + 2 + 8 * j);
  const uint32_t sign_scale = ld_u32_a2(b + 2 + 8 * j + 4);
  const float db = d * (0.5f + small_f32(sign_scale >> 28)) * 0.25f;
  const uint32_t lo = bf16x2_rn(db * 8.0f, db * 25.0f), hi = bf16x2_rn(db * 43.0f, 0.0f);
  for (int l = 0; l < 4; ++l) {
    const uint2 s = sel[(grid_idx >> (8 * l)) & 0xffu];
    const uint4 m = sign[(sign_scale >> (7 * l)) & 127u];
    o[4 * l + 0] = prmt(lo, hi, s.x) ^ m.x;
    o[4 * l + 1] = prmt(lo, hi, s.x >> 16) ^ m.y;
    o[4 * l + 2] = prmt(lo, hi, s.y) ^ m.z;
    o[4 * l + 3] = prmt(lo, hi, s.y >> 16) ^ m.w;
  }
}

// ---- Sub-block decoders of the register-operand kernels (moe_grouped_ggml_v2.cu).
// A lane there takes the 16 elements of one sub-block sb (0..15, elements
// [16 sb, 16 sb + 16) of the super-block) of a row, half hh (0, 1) at a time:
// o[i] = elements 16 sb + 8 hh + 2i, 2i + 1, i = 0..3. The values (one
// table per sub-block, then one prmt per pair) are computed exactly as by the
// chunk decoders above, so the words equal words 8 (sb & 1) + 4 hh + i of
// chunk sb / 2 bit for bit (the test holds them to that). The table is
// computed once per sub-block and kept for both halves.

// Q2_K: table = bf16 values of codes 0, 1 | 2, 3 of sub-block sb.
__host__ __device__ __forceinline__ uint2 q2k_sub_table(const uint8_t* b, int sb) {
  const float d = f16_f32(ld_u16(b + 80)), dmin = f16_f32(ld_u16(b + 82));
  const uint32_t sc = b[sb];
  const float dl = d * small_f32(sc & 0xfu), ml = dmin * small_f32(sc >> 4);
  return make_uint2(bf16x2_rn(dl * 0.0f - ml, dl - ml), bf16x2_rn(2.0f * dl - ml, 3.0f * dl - ml));
}
__host__ __device__ __forceinline__ void q2k_sub_half(const uint8_t* b, int sb, int hh, uint2 t, uint32_t (&o)[4]) {
  const uint8_t* qs = b + 16 + (sb >> 3) * 32 + 16 * (sb & 1) + 8 * hh;
  const int shift = 2 * ((sb & 7) >> 1);
  for (int i = 0; i < 2; ++i) {
    const uint32_t s = pick_selector((ld_u32_a4(qs + 4 * i) >> shift) & 0x03030303u);
    o[2 * i] = prmt(t.x, t.y, s);
    o[2 * i + 1] = prmt(t.x, t.y, s >> 16);
  }
}

// Q3_K: table = bf16 values -4, -3 | -2, -1 | 0, 1 | 2, 3 (times dl) of sub-block sb.
__host__ __device__ __forceinline__ uint4 q3k_sub_table(const uint8_t* b, int sb) {
  const float d = f16_f32(ld_u16(b + 108));
  const uint8_t* sc = b + 96;
  const uint32_t low4 = sb < 8 ? (sc[sb] & 0x0fu) : (uint32_t(sc[sb - 8]) >> 4);
  const uint32_t high2 = (uint32_t(sc[8 + (sb & 3)]) >> (2 * (sb >> 2))) & 3u;
  const float dl = d * (small_f32(low4 | (high2 << 4)) - 32.0f);
  return make_uint4(bf16x2_rn(-4.0f * dl, -3.0f * dl), bf16x2_rn(-2.0f * dl, -1.0f * dl),
                    bf16x2_rn(0.0f * dl, dl), bf16x2_rn(2.0f * dl, 3.0f * dl));
}
__host__ __device__ __forceinline__ void q3k_sub_half(const uint8_t* b, int sb, int hh, uint4 t, uint32_t (&o)[4]) {
  const int j = sb >> 1, off = 16 * (sb & 1) + 8 * hh;
  const uint8_t* qs = b + 32 + (j >> 2) * 32 + off;
  const int shift = 2 * (j & 3);
  for (int i = 0; i < 2; ++i) {
    const uint32_t s = pick_selector((ld_u32_a2(qs + 4 * i) >> shift) & 0x03030303u);
    const uint32_t hm = ld_u32_a2(b + off + 4 * i) << (7 - j);
    const uint32_t m01 = prmt(hm, 0u, 0x9988u), m23 = prmt(hm, 0u, 0xbbaau);
    o[2 * i] = (prmt(t.x, t.y, s) & ~m01) | (prmt(t.z, t.w, s) & m01);
    o[2 * i + 1] = (prmt(t.x, t.y, s >> 16) & ~m23) | (prmt(t.z, t.w, s >> 16) & m23);
  }
}

// IQ2_XXS: table = bf16 magnitudes 8, 25 | 43, 0 (times db) of the 32 elements
// holding sub-block sb; half hh is grid entry l = 2 (sb & 1) + hh of them.
__host__ __device__ __forceinline__ uint2 iq2xxs_sub_table(const uint8_t* b, int sb) {
  const float d = f16_f32(ld_u16(b));
  const uint32_t sign_scale = ld_u32_a2(b + 2 + 8 * (sb >> 1) + 4);
  const float db = d * (0.5f + small_f32(sign_scale >> 28)) * 0.25f;
  return make_uint2(bf16x2_rn(db * 8.0f, db * 25.0f), bf16x2_rn(db * 43.0f, 0.0f));
}
__host__ __device__ __forceinline__ void iq2xxs_sub_half(const uint8_t* b, int sb, int hh, uint2 t, const uint2* sel,
                                                         const uint4* sign, uint32_t (&o)[4]) {
  const uint8_t* q = b + 2 + 8 * (sb >> 1);
  const int l = 2 * (sb & 1) + hh;
  const uint2 s = sel[(ld_u32_a2(q) >> (8 * l)) & 0xffu];
  const uint4 m = sign[(ld_u32_a2(q + 4) >> (7 * l)) & 127u];
  o[0] = prmt(t.x, t.y, s.x) ^ m.x;
  o[1] = prmt(t.x, t.y, s.x >> 16) ^ m.y;
  o[2] = prmt(t.x, t.y, s.y) ^ m.z;
  o[3] = prmt(t.x, t.y, s.y >> 16) ^ m.w;
}

}  // namespace aff::cuda::moe_grouped
