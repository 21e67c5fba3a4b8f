// Device pieces of the streaming decode MoE (moe_decode_fast.cu):
//  - per-warp weight rings filled by the Hopper bulk-copy engine (cp.async.bulk
//    into shared memory, completion counted on an mbarrier), so the bytes in
//    flight do not depend on registers or on how many lanes issue loads;
//  - int8 activations with one f32 scale per 16 elements ("q16"), the layout
//    the up launch writes for the routed pairs and stages for x;
//  - lane dot products of one half super-block (128 elements) of a Q2_K, Q3_K
//    or IQ2_XXS row, with the lane's 128 activations held in registers and
//    reused for every row the lane meets;
//  - the FP8 (E4M3, block scales) tensor-core step of the shared expert.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels/common/decode.cuh"
#include "backend/cuda/kernels/common/ggml_tables.h"
#include "backend/cuda/kernels/gemm/mma_bf16.cuh"

namespace aff::cuda::moe_fast {

// ---- shared memory, mbarriers, bulk copies ---------------------------------------------

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}

// Makes this thread's mbarrier.init visible to the bulk-copy engine (async proxy).
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Ends a barrier's life before its memory is used for anything else (every
// phase it tracked has completed).
__device__ __forceinline__ void mbar_inval(uint64_t* bar) {
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];" ::"r"(smem_u32(bar)) : "memory");
}

// One arrival that also announces `bytes` of copies completing on the barrier.
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n\t.reg .pred p;\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
        "selp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
  } while (!done);
}

// Asks L1 for the line holding p (global memory), without a register or a wait.
__device__ __forceinline__ void prefetch_l1(const void* p) {
  asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
}

// One arrival on bar without bytes (e.g. for a row that does not exist).
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}

// Global -> shared copy of `bytes` (multiple of 16; both addresses 16-byte aligned).
__device__ __forceinline__ void bulk_g2s(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_u32(dst)),
               "l"(src), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
}

// A byte range [src, src + len) widened to 16-byte boundaries, as a bulk copy
// needs them: it starts `skew` bytes into its copy of `bytes` bytes. The extra
// bytes belong to the same 256-byte-aligned allocation (the arena aligns every
// tensor), so reading them is safe.
struct Span16 {
  const uint8_t* base;
  uint32_t bytes, skew;
};
__device__ __forceinline__ Span16 span16(const uint8_t* src, int64_t len) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(src) & ~uintptr_t(15);
  const uintptr_t e = (reinterpret_cast<uintptr_t>(src) + uintptr_t(len) + 15) & ~uintptr_t(15);
  return {reinterpret_cast<const uint8_t*>(a), uint32_t(e - a), uint32_t(reinterpret_cast<uintptr_t>(src) - a)};
}

// ---- integer helpers -------------------------------------------------------------------

// Unsigned bytes of a times signed bytes of b, summed into c.
__device__ __forceinline__ int dp4a_us(uint32_t a, int b, int c) {
  int d;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// Byte k (0..3, compile-time after unrolling) of w as a float, through the
// f32 bit pattern 2^23 + byte (one byte permute and one add, no conversion unit).
__device__ __forceinline__ float byte_f(uint32_t w, int k) {
  return __int_as_float(int(__byte_perm(w, 0x4B000000u, 0x7440u | uint32_t(k)))) - 8388608.0f;
}

__device__ __forceinline__ float f16_bits(uint32_t h) { return __half2float(__ushort_as_half(uint16_t(h & 0xffffu))); }

// ---- q16 activations -------------------------------------------------------------------
//
// n elements (n a multiple of 128): codes int8 [n], then scales f32 [n / 16]
// (amax / 127 of each 16 elements), then sums f32 [n / 16] (scale x the sum of
// the 16 codes, for the formats' min / offset terms). 1.5 bytes per element.
__host__ __device__ constexpr int64_t q16_bytes(int64_t n) { return n + n / 4 + n / 4; }

// Quantises v[0..16) into 16 codes (returned as 4 words), *scale and *sum.
__device__ __forceinline__ uint4 q16_quantise(const float (&v)[16], float& scale, float& sum) {
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; ++i) amax = fmaxf(amax, fabsf(v[i]));
  scale = amax / 127.0f;
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  uint32_t w[4] = {0, 0, 0, 0};
  int total = 0;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int q = __float2int_rn(v[i] * inv);
    total += q;
    w[i / 4] |= (uint32_t(q) & 0xffu) << (8 * (i % 4));
  }
  sum = scale * float(total);
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// The 128 activations of one lane unit (elements [128u, 128u + 128) of a row's
// input), held in registers while the lane walks rows.
struct XUnit {
  int q[32];    // codes: word 8j + i = elements 32j + 4i .. 32j + 4i + 3
  float s[8];   // per 16 elements: scale, pre-divided by the format's bit-position factor (see load_xunit)
  float f[8];   // per 16 elements: scale x sum of codes
};

enum class Fmt : int { kQ2_K, kQ3_K, kIQ2_XXS };

// codes/scales/sums: a q16 vector (shared or global memory, 16-byte aligned).
// Q2_K and Q3_K lanes multiply codes taken in place at bit 2j of each byte
// (no shift), so the scale of chunk j carries the inverse factor.
template <Fmt F>
__device__ __forceinline__ void load_xunit(const uint8_t* codes, const float* scales, const float* sums, int u,
                                           XUnit& x) {
  const uint4* c = reinterpret_cast<const uint4*>(codes + 128 * u);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint4 v = c[i];
    x.q[4 * i] = int(v.x), x.q[4 * i + 1] = int(v.y), x.q[4 * i + 2] = int(v.z), x.q[4 * i + 3] = int(v.w);
  }
  const float4* s = reinterpret_cast<const float4*>(scales + 8 * u);
  const float4* f = reinterpret_cast<const float4*>(sums + 8 * u);
  const float4 s0 = s[0], s1 = s[1], f0 = f[0], f1 = f[1];
  x.s[0] = s0.x, x.s[1] = s0.y, x.s[2] = s0.z, x.s[3] = s0.w, x.s[4] = s1.x, x.s[5] = s1.y, x.s[6] = s1.z,
  x.s[7] = s1.w;
  x.f[0] = f0.x, x.f[1] = f0.y, x.f[2] = f0.z, x.f[3] = f0.w, x.f[4] = f1.x, x.f[5] = f1.y, x.f[6] = f1.z,
  x.f[7] = f1.w;
  if constexpr (F == Fmt::kQ2_K) {
    const float k[4] = {1.0f, 0.25f, 0.0625f, 0.015625f};
#pragma unroll
    for (int i = 0; i < 8; ++i) x.s[i] *= k[i / 2];
  } else if constexpr (F == Fmt::kQ3_K) {
    const float k[4] = {1.0f, 0.25f, 0.0625f, 0.0625f};  // chunk 3 is shifted down by 2 (see q3k_unit)
#pragma unroll
    for (int i = 0; i < 8; ++i) x.s[i] *= k[i / 2];
  }
}

// ---- lane unit dots --------------------------------------------------------------------
//
// A lane unit is half h of a 256-element super-block: elements [128h, 128h + 128).
// In Q2_K/Q3_K the 2-bit codes of element 128h + 32j + l sit at bits 2j..2j+1 of
// qs byte 32h + l, so one qs word feeds 4 chunks j; sub-block (16 elements)
// k = 2j + (l >= 16) of the unit is super-block sub-block 8h + k.

// Q2_K (84 bytes: scales[16] (low nibble scale, high nibble min), qs[64], f16 d,
// f16 dmin), super-block at b (4-byte aligned). Returns sum_e w_e * x_e.
__device__ __forceinline__ float q2k_unit(const uint8_t* b, int h, const XUnit& x) {
  const uint32_t* w = reinterpret_cast<const uint32_t*>(b);
  uint32_t q[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) q[i] = w[4 + 8 * h + i];
  const uint32_t sc[2] = {w[2 * h], w[2 * h + 1]};
  const uint32_t dd = w[20];
  float ad = 0.0f, am = 0.0f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t M = 0x03030303u << (2 * j);
    int s0 = 0, s1 = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      s0 = dp4a_us(q[i] & M, x.q[8 * j + i], s0);
      s1 = dp4a_us(q[4 + i] & M, x.q[8 * j + 4 + i], s1);
    }
    const uint32_t lo = sc[j >> 1] & 0x0f0f0f0fu, hi = (sc[j >> 1] >> 4) & 0x0f0f0f0fu;
    const int k0 = (2 * j) & 3, k1 = (2 * j + 1) & 3;
    // scale * sum in integers (4 bits x < 2^21), one conversion per 16 elements
    ad = fmaf(float(int(__byte_perm(lo, 0u, 0x4440u | uint32_t(k0))) * s0), x.s[2 * j], ad);
    ad = fmaf(float(int(__byte_perm(lo, 0u, 0x4440u | uint32_t(k1))) * s1), x.s[2 * j + 1], ad);
    am = fmaf(byte_f(hi, k0), x.f[2 * j], am);
    am = fmaf(byte_f(hi, k1), x.f[2 * j + 1], am);
  }
  return f16_bits(dd) * ad - f16_bits(dd >> 16) * am;
}

// Q3_K (110 bytes: hmask[32], qs[64], scales[12] (6-bit, -32), f16 d), super-block
// at b (2-byte aligned: words are read aligned and funnel-shifted). Element
// value = low2 + 4 * hbit - 4, hbit = bit (4h + j) of hmask byte l.
__device__ __forceinline__ float q3k_unit(const uint8_t* b, int h, const XUnit& x) {
  // Aligned down by pointer arithmetic (not through an integer) so the compiler
  // keeps the shared-memory address space and emits LDS.
  const uint32_t mis = uint32_t(reinterpret_cast<uintptr_t>(b) & 3u);
  const uint32_t* w = reinterpret_cast<const uint32_t*>(b - mis);
  const uint32_t sh = mis * 8u;  // 0 or 16
  uint32_t hm[8], q[8];
  {
    uint32_t a[9];
#pragma unroll
    for (int i = 0; i < 9; ++i) a[i] = w[i];
    // hmask word i, moved down by 4h bits: bit j of each byte is chunk j's high bit.
#pragma unroll
    for (int i = 0; i < 8; ++i) hm[i] = __funnelshift_r(a[i], a[i + 1], sh + 4u * uint32_t(h));
#pragma unroll
    for (int i = 0; i < 9; ++i) a[i] = w[8 + 8 * h + i];
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] = __funnelshift_r(a[i], a[i + 1], sh);
  }
  uint32_t c6[2];
  float d;
  {
    const uint32_t a0 = w[24], a1 = w[25], a2 = w[26], a3 = w[27];
    const uint32_t s0 = __funnelshift_r(a0, a1, sh), s1 = __funnelshift_r(a1, a2, sh), s2 = __funnelshift_r(a2, a3, sh);
    d = f16_bits(a3 >> sh);
    // Scales of sub-blocks 8h + k, k = 0..7, as bytes 0..63: low 4 bits from
    // scales[k] (nibble h), high 2 bits from scales[8 + (k & 3)] at bit 4h + 2 (k >> 2).
    const uint32_t hs = 4u * uint32_t(h);
    c6[0] = ((s0 >> hs) & 0x0f0f0f0fu) | (((s2 >> hs) & 0x03030303u) << 4);
    c6[1] = ((s1 >> hs) & 0x0f0f0f0fu) | (((s2 >> (hs + 2)) & 0x03030303u) << 4);
  }
  float ad = 0.0f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    int s0 = 0, s1 = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      // (low2 + 4 hbit) at bits 2j.. (chunks 0-2) or 4.. (chunk 3, shifted down by 2).
      uint32_t v;
      if (j < 3) v = (q[i] & (0x03030303u << (2 * j))) | ((hm[i] << (j + 2)) & (0x04040404u << (2 * j)));
      else v = ((q[i] >> 2) & 0x30303030u) | ((hm[i] << 3) & 0x40404040u);
      if (i < 4) s0 = dp4a_us(v, x.q[8 * j + i], s0);
      else s1 = dp4a_us(v, x.q[8 * j + i], s1);
    }
    const int k0 = (2 * j) & 3, k1 = (2 * j + 1) & 3;
    const float sc0 = byte_f(c6[j >> 1], k0) - 32.0f, sc1 = byte_f(c6[j >> 1], k1) - 32.0f;
    ad = fmaf(sc0, fmaf(-4.0f, x.f[2 * j], float(s0) * x.s[2 * j]), ad);
    ad = fmaf(sc1, fmaf(-4.0f, x.f[2 * j + 1], float(s1) * x.s[2 * j + 1]), ad);
  }
  return d * ad;
}

// IQ2_XXS lookup tables in shared memory, replicated so that a warp's
// data-dependent reads never meet in a bank: the grid (256 entries of 8 bytes)
// 16 times, entry e of copy c at byte (16e + c) * 8 (an LDS.64 half-warp reads
// copy lane & 15, each copy in its own bank pair); the signs (128 entries: xor
// masks for the 8 bytes, then the matching +1 bytes, 16 bytes) 8 times, entry e
// of copy c at byte (8e + c) * 16 (an LDS.128 quarter-warp reads copy lane & 7).
constexpr int kIq2GridBytes = 256 * 16 * 8;
constexpr int kIq2SignBytes = 128 * 8 * 16;
constexpr int kIq2TableBytes = kIq2GridBytes + kIq2SignBytes;

__device__ __forceinline__ void iq2_tables_build(const GgmlTables* tab, uint8_t* smem) {
  uint64_t* grid = reinterpret_cast<uint64_t*>(smem);
  for (int e = threadIdx.x; e < 256 * 16; e += blockDim.x) grid[e] = tab->iq2xxs_grid[e >> 4];
  uint4* sign = reinterpret_cast<uint4*>(smem + kIq2GridBytes);
  for (int e = threadIdx.x; e < 128 * 8; e += blockDim.x) {
    const uint32_t s = tab->signs_iq2xs[e >> 3];
    uint32_t m[2] = {0, 0};
#pragma unroll
    for (int n = 0; n < 8; ++n)
      if ((s >> n) & 1u) m[n >> 2] |= 0xffu << (8 * (n & 3));
    sign[e] = make_uint4(m[0], m[1], m[0] & 0x01010101u, m[1] & 0x01010101u);
  }
}

// IQ2_XXS (66 bytes: f16 d, then per 32 elements a u32 of four grid indices and
// a u32 of four 7-bit sign indices | 4-bit scale << 28), super-block at b
// (2-byte aligned). grid/sign: this lane's copies of the tables.
__device__ __forceinline__ float iq2xxs_unit(const uint8_t* b, int h, const XUnit& x, const uint8_t* grid,
                                             const uint8_t* sign) {
  const float d = f16_bits(*reinterpret_cast<const uint16_t*>(b));
  const uint8_t* p = b + 2 + 32 * h;
  const uint32_t mis = uint32_t(reinterpret_cast<uintptr_t>(p) & 3u);
  const uint32_t* w = reinterpret_cast<const uint32_t*>(p - mis);  // see q3k_unit
  const uint32_t sh = mis * 8u;
  uint32_t a[9];
#pragma unroll
  for (int i = 0; i < 9; ++i) a[i] = w[i];
  float acc = 0.0f;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const uint32_t gi = __funnelshift_r(a[2 * c], a[2 * c + 1], sh);
    const uint32_t ss = __funnelshift_r(a[2 * c + 1], a[2 * c + 2], sh);
    int s0 = 0, s1 = 0;
#pragma unroll
    for (int l = 0; l < 4; ++l) {
      const uint2 g = *reinterpret_cast<const uint2*>(grid + (__byte_perm(gi, 0u, 0x4440u | uint32_t(l)) << 7));
      const uint4 m = *reinterpret_cast<const uint4*>(sign + (((ss >> (7 * l)) & 127u) << 7));
      const int v0 = int((g.x ^ m.x) + m.z), v1 = int((g.y ^ m.y) + m.w);  // bytes +-grid: no carries (grid <= 43)
      if (l < 2) s0 = __dp4a(v1, x.q[8 * c + 2 * l + 1], __dp4a(v0, x.q[8 * c + 2 * l], s0));
      else s1 = __dp4a(v1, x.q[8 * c + 2 * l + 1], __dp4a(v0, x.q[8 * c + 2 * l], s1));
    }
    const float db = (byte_f(ss >> 28, 0) + 0.5f) * 0.25f;
    acc = fmaf(db, fmaf(float(s0), x.s[2 * c], float(s1) * x.s[2 * c + 1]), acc);
  }
  return d * acc;
}

// ---- FP8 shared expert on tensor cores -------------------------------------------------
//
// mma.sync m16n8k16 (f16 in, f32 accumulate), lane = 4g + c. A dot product does
// not care about the order of its terms, so lane (g, c) loads 16 consecutive
// weight bytes [16c, 16c + 16) of a 64-column step from its two A rows, and MMA
// j of the step takes bytes [4j, 4j + 4) as its columns {2c, 2c+1, 2c+8, 2c+9}.
// The activations (B, one token per column n = g) follow the same map: 16
// consecutive f16 per lane. E4M3 -> f16 is exact (hardware conversion,
// e4m3x2_to_f16x2 in common/decode.cuh; weight loads by ld_stream16 there).

// One 64-column step: ra = 16 weight bytes of A row g, rb = of A row g + 8;
// xh/xl: the lane's 16 activation f16 (hi, and lo when kExact) in shared memory.
template <bool kExact>
__device__ __forceinline__ void fp8_step(const uint4& ra, const uint4& rb, const __half* xh, const __half* xl,
                                         float (&cb)[4]) {
  const uint4 h0 = *reinterpret_cast<const uint4*>(xh), h1 = *reinterpret_cast<const uint4*>(xh + 8);
  const uint32_t hw[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
  uint32_t lw[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if constexpr (kExact) {
    const uint4 l0 = *reinterpret_cast<const uint4*>(xl), l1 = *reinterpret_cast<const uint4*>(xl + 8);
    lw[0] = l0.x, lw[1] = l0.y, lw[2] = l0.z, lw[3] = l0.w, lw[4] = l1.x, lw[5] = l1.y, lw[6] = l1.z, lw[7] = l1.w;
  }
  const uint32_t wa[4] = {ra.x, ra.y, ra.z, ra.w}, wb[4] = {rb.x, rb.y, rb.z, rb.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t a[4] = {e4m3x2_to_f16x2(wa[j]), e4m3x2_to_f16x2(wb[j]), e4m3x2_hi_to_f16x2(wa[j]),
                           e4m3x2_hi_to_f16x2(wb[j])};
    mma_f16_16816(cb, a, hw[2 * j], hw[2 * j + 1]);
    if constexpr (kExact) mma_f16_16816(cb, a, lw[2 * j], lw[2 * j + 1]);
  }
}

// The exponent e of the largest |value| of a warp's 64-column group (each lane
// holding two in v): max = f 2^e, f in [0.5, 1); at least -100, so that
// scaling by 2^(p - e) stays finite; 0 for an all-zero group.
__device__ __forceinline__ int group_max_exponent(float2 v) {
  float m = fmaxf(fabsf(v.x), fabsf(v.y));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  int e = 0;
  if (m > 0.0f && m <= 3.0e38f) frexpf(m, &e);
  return max(e, -100);
}

// One 64-column group of an activation row as f16 scaled by a power of two
// (the group's max lands in [2^13, 2^14): no overflow, no rounding from the
// scaling): hi = rn(x * 2^e), lo = rn(x * 2^e - hi) when kExact, inv = 2^-e.
// A warp per group: v = the lane's two columns 2 lane, 2 lane + 1; hi / lo
// point at the group's 64 f16.
template <bool kExact>
__device__ __forceinline__ void stage_f16_group(float2 v, __half* hi, __half* lo, float* inv) {
  const int lane = threadIdx.x & 31;
  const int e = group_max_exponent(v);
  const float up = ldexpf(1.0f, 14 - e);
  const float s0 = v.x * up, s1 = v.y * up;
  const __half h0 = __float2half_rn(s0), h1 = __float2half_rn(s1);
  reinterpret_cast<uint32_t*>(hi)[lane] = uint32_t(__half_as_ushort(h0)) | (uint32_t(__half_as_ushort(h1)) << 16);
  if constexpr (kExact) {
    const __half l0 = __float2half_rn(s0 - __half2float(h0)), l1 = __float2half_rn(s1 - __half2float(h1));
    reinterpret_cast<uint32_t*>(lo)[lane] = uint32_t(__half_as_ushort(l0)) | (uint32_t(__half_as_ushort(l1)) << 16);
  }
  if (lane == 0) *inv = ldexpf(1.0f, e - 14);
}

// Block-cooperative: tokens [0, nt) of x (row t at x + t * ldx, n floats, n a
// multiple of 64) staged group by group (stage_f16_group). Row t of hi/lo
// starts at t * ld f16; inv[t * (n / 64) + g] = 2^-e. A warp per group, two
// columns per lane: coalesced reads, conflict-free shared stores.
template <bool kExact>
__device__ __forceinline__ void stage_f16_pairs(const float* __restrict__ x, int64_t ldx, int nt, int n, __half* hi,
                                                __half* lo, int ld, float* inv) {
  const int groups = n / 64, lane = threadIdx.x & 31;
  for (int gi = threadIdx.x >> 5; gi < nt * groups; gi += blockDim.x >> 5) {
    const int t = gi / groups, g = gi % groups;
    const float2 v = reinterpret_cast<const float2*>(x + t * ldx + g * 64)[lane];
    stage_f16_group<kExact>(v, hi + t * ld + g * 64, lo + t * ld + g * 64, inv + t * groups + g);
  }
}

}  // namespace aff::cuda::moe_fast
