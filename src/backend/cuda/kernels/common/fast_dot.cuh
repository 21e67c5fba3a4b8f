// Lane-level dot products of weight rows with up to TT activation rows, the
// building block of the bandwidth-bound GEMV and expert kernels.
//
// A row is cut into chunks (16 stored bytes for FP8/BF16/F16/F32/MXFP4, one
// 32-element sub-block for ggml formats); lane `lane` of part `part` of S parts
// takes chunks part*32 + lane, then every 32*S-th. Each chunk is decoded once
// and dotted with all nt tokens, so a weight byte is read once per token tile.
//
// Weights are loaded with L1::no_allocate (read once, streamed), so L1 keeps
// the activations that every warp of the SM reads again.
//  - native formats: f32 activations from global memory (L1 hits) or a
//    permuted shared-memory copy; FP8/MXFP4 codes become f32 by bit placement,
//    scaled by a power of two folded into the block scale;
//  - ggml formats: int8 activations staged in shared memory (act_q8.cuh) and
//    dp4a over int8 weight words; scales and mins applied per sub-block.
//    Q8_0, Q2_K, Q3_K, Q4_K, IQ2_XXS, IQ4_XS, IQ4_NL, MXFP4 have integer paths;
//    the other ggml types decode to f32 (ggml_decode.cuh) and dot in f32.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels/common/act_q8.cuh"
#include "backend/cuda/kernels/common/decode.cuh"
#include "backend/cuda/kernels/common/ggml_decode.cuh"
#include "backend/cuda/kernels/common/row_dot.cuh"

namespace aff::cuda {

// f32 activations of a native-format row. A lane's 16-byte weight chunk covers
// V consecutive columns, so lanes read x 4V bytes apart: plain loads touch a
// sector per lane (L1/shared-memory wavefronts, not HBM, then bound the GEMV).
// When `perm` is set the block has staged x in shared memory permuted per group
// of 32 chunks (act_f32_stage_perm) so that lane l's j-th float4 sits at
// perm + group*32V + j*128 + l*4: one float4 load per lane covers 512
// contiguous bytes across the warp.
struct ActF32 {
  const float* x;             // token t at x + t*ld (global memory)
  int64_t ld;
  bool vec;                   // x and ld allow float4 loads
  const float* perm = nullptr;  // shared-memory permuted copy, token t at perm + t*perm_ld
  int64_t perm_ld = 0;
};

// Block-cooperative: tokens [0, nt) of x (row t at x + t*ldx, n floats, n a
// multiple of 32V, V a power of two) into smem permuted for chunks of V
// elements (see ActF32). 32-bit index math: this runs once per block.
__device__ __forceinline__ void act_f32_stage_perm(const float* __restrict__ x, int64_t ldx, int nt, int64_t n, int V,
                                                   float* smem) {
  const uint32_t lv = uint32_t(__ffs(V) - 1), group_mask = (32u << lv) - 1u;
  for (int t = 0; t < nt; ++t) {
    for (uint32_t k = threadIdx.x; k < uint32_t(n); k += blockDim.x) {
      const uint32_t r = k & group_mask, l = r >> lv, e = r & uint32_t(V - 1);
      smem[t * n + (k - r) + (e >> 2) * 128u + l * 4u + (e & 3u)] = x[t * ldx + k];
    }
  }
}

template <int N>
__device__ __forceinline__ void load_x(const ActF32& a, int t, int64_t col, float* v) {
  if (a.perm) {
    const int64_t c = col / N;  // the chunk; its lane in the group is c % 32
    const float* p = a.perm + t * a.perm_ld + (c - (c & 31)) * N + (c & 31) * 4;
#pragma unroll
    for (int j = 0; j < N / 4; ++j) {
      const float4 f = *reinterpret_cast<const float4*>(p + j * 128);
      v[4 * j] = f.x, v[4 * j + 1] = f.y, v[4 * j + 2] = f.z, v[4 * j + 3] = f.w;
    }
    return;
  }
  const float* p = a.x + t * a.ld + col;
  if (a.vec) {
#pragma unroll
    for (int i = 0; i < N; i += 4) {
      const float4 f = __ldg(reinterpret_cast<const float4*>(p + i));
      v[i] = f.x, v[i + 1] = f.y, v[i + 2] = f.z, v[i + 3] = f.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = __ldg(p + i);
  }
}

// ---- native formats, f32 activations -------------------------------------------------

// E4M3 byte k of word wd as f32 times 2^-120 (exact, subnormals included): the
// 7 magnitude bits go to the top of the f32 exponent/mantissa, the sign to bit 31.
__device__ __forceinline__ float e4m3_scaled(uint32_t wd, int k) {
  const uint32_t sh = 8u * uint32_t(k);
  const uint32_t b = wd >> sh;
  return __uint_as_float(((b & 0x80u) << 24) | ((b & 0x7fu) << 20));
}

// E2M1 code (low 4 bits of c) as f32 times 2^-126.
__device__ __forceinline__ float e2m1_scaled(uint32_t c) {
  return __uint_as_float(((c & 8u) << 28) | ((c & 7u) << 22));
}

// Per-row constants of a native weight, computed once per row (integer
// division is far too slow for the per-chunk path).
struct RowCtx {
  int64_t scale_row = 0;  // FP8: first scale of this row's tile row
  int block_shift = -1;   // FP8: log2(block) when block is a power of two, else -1
};

template <DevFormat F>
struct NativeChunk;  // kElems elements per 16-byte chunk

// Formats of one byte per code (FP8, kQ8): 16 codes per chunk.
struct ByteChunk {
  static constexpr int kElems = 16;
  __device__ static uint4 load(const DeviceLinear& w, int64_t row, int64_t c) {
    return ld_stream16(w.weight + row * w.in + c * 16);
  }
};

template <>
struct NativeChunk<DevFormat::kFP8Block> : ByteChunk {
  template <int TT>
  __device__ static void dot(const DeviceLinear& w, const RowCtx& rc, int64_t c, const uint4 v, const ActF32& x,
                             int nt, float (&acc)[TT]) {
    const int64_t col = c * 16;
    const uint32_t scol = rc.block_shift >= 0 ? uint32_t(col) >> rc.block_shift : uint32_t(col) / uint32_t(w.block);
    const float s = load_scale(w, rc.scale_row + scol);
    const uint32_t wd[4] = {v.x, v.y, v.z, v.w};
    float wv[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) wv[i] = e4m3_scaled(wd[i / 4], i % 4);
#pragma unroll
    for (int t = 0; t < TT; ++t) {
      if (t < nt) {
        float xv[16];
        load_x<16>(x, t, col, xv);
        float p = 0.0f;
#pragma unroll
        for (int i = 0; i < 16; ++i) p = fmaf(wv[i], xv[i], p);
        acc[t] = fmaf(p * 0x1p120f, s, acc[t]);  // p * 2^120 is the exact partial sum
      }
    }
  }
};

template <>
struct NativeChunk<DevFormat::kMXFP4> {
  static constexpr int kElems = 32;  // 16 bytes = 32 codes = one scale group
  __device__ static uint4 load(const DeviceLinear& w, int64_t row, int64_t c) {
    return ld_stream16(w.weight + row * (w.in / 2) + c * 16);
  }
  template <int TT>
  __device__ static void dot(const DeviceLinear& w, const RowCtx& rc, int64_t c, const uint4 v, const ActF32& x,
                             int nt, float (&acc)[TT]) {
    const int64_t col = c * 32;
    const float s = load_scale(w, rc.scale_row + c);
    const uint32_t wd[4] = {v.x, v.y, v.z, v.w};
    float wv[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) wv[i] = e2m1_scaled(wd[i / 8] >> (4 * (i % 8)));
#pragma unroll
    for (int t = 0; t < TT; ++t) {
      if (t < nt) {
        float xv[32];
        load_x<32>(x, t, col, xv);
        float p = 0.0f;
#pragma unroll
        for (int i = 0; i < 32; ++i) p = fmaf(wv[i], xv[i], p);
        acc[t] = fmaf(p * 0x1p126f, s, acc[t]);
      }
    }
  }
};

// kQ8: a chunk is 16 stored codes, quarter q = c % 4 of a 64-column step:
// columns [8q, 8q + 8) of the step's first scale group and the same of its
// second (q8_code_at). Each half is summed and then scaled. Needs x unpermuted
// (launch_fast never permutes x for kQ8).
template <>
struct NativeChunk<DevFormat::kQ8> : ByteChunk {
  template <int TT>
  __device__ static void dot(const DeviceLinear& w, const RowCtx& rc, int64_t c, const uint4 v, const ActF32& x,
                             int nt, float (&acc)[TT]) {
    const int64_t step = c >> 2, col = step * 64 + (c & 3) * 8;
    const float s0 = load_scale(w, rc.scale_row + 2 * step), s1 = load_scale(w, rc.scale_row + 2 * step + 1);
    const uint32_t wd[4] = {v.x, v.y, v.z, v.w};
    float wv[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) wv[i] = float(int8_t((wd[i / 4] >> (8 * (i % 4))) & 0xffu));
#pragma unroll
    for (int t = 0; t < TT; ++t) {
      if (t < nt) {
        float xa[8], xb[8];
        load_x<8>(x, t, col, xa);
        load_x<8>(x, t, col + 32, xb);
        float p0 = 0.0f, p1 = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) p0 = fmaf(wv[i], xa[i], p0), p1 = fmaf(wv[8 + i], xb[i], p1);
        acc[t] = fmaf(p1, s1, fmaf(p0, s0, acc[t]));
      }
    }
  }
};

template <DevFormat F>
struct PlainChunk {  // BF16, F16, F32
  static constexpr int kElems = VecTraits<F>::kElems;
  __device__ static uint4 load(const DeviceLinear& w, int64_t row, int64_t c) {
    return ld_stream16(w.weight + (row * w.in + c * kElems) * (F == DevFormat::kF32 ? 4 : 2));
  }
  template <int TT>
  __device__ static void dot(const DeviceLinear&, const RowCtx&, int64_t c, const uint4 v, const ActF32& x, int nt,
                             float (&acc)[TT]) {
    constexpr int V = kElems;
    const int64_t col = c * V;
    const uint32_t wd[4] = {v.x, v.y, v.z, v.w};
    float wv[V];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (F == DevFormat::kF32) {
        wv[i] = __uint_as_float(wd[i]);
      } else if constexpr (F == DevFormat::kBF16) {
        wv[2 * i] = __uint_as_float(wd[i] << 16);
        wv[2 * i + 1] = __uint_as_float(wd[i] & 0xffff0000u);
      } else {
        wv[2 * i] = f16_bits_to_f32(uint16_t(wd[i] & 0xffffu));
        wv[2 * i + 1] = f16_bits_to_f32(uint16_t(wd[i] >> 16));
      }
    }
#pragma unroll
    for (int t = 0; t < TT; ++t) {
      if (t < nt) {
        float xv[V];
        load_x<V>(x, t, col, xv);
        float p = 0.0f;
#pragma unroll
        for (int i = 0; i < V; ++i) p = fmaf(wv[i], xv[i], p);
        acc[t] += p;
      }
    }
  }
};
template <>
struct NativeChunk<DevFormat::kBF16> : PlainChunk<DevFormat::kBF16> {};
template <>
struct NativeChunk<DevFormat::kF16> : PlainChunk<DevFormat::kF16> {};
template <>
struct NativeChunk<DevFormat::kF32> : PlainChunk<DevFormat::kF32> {};

template <DevFormat F, int TT>
__device__ __forceinline__ void native_row_part(const DeviceLinear& w, int64_t row, const ActF32& x, int nt,
                                                int part, int S, float (&acc)[TT]) {
  const int lane = threadIdx.x & 31;
  if (vec_ok<F>(w)) {
    // kUnroll 16-byte loads issued before any is used: enough bytes in flight per
    // SM to cover HBM latency at 32 resident warps.
    constexpr int kUnroll = 4;
    RowCtx rc;
    if constexpr (F == DevFormat::kFP8Block) {
      rc.scale_row = (row / w.block) * w.scale_cols;
      rc.block_shift = (w.block & (w.block - 1)) == 0 ? __ffs(w.block) - 1 : -1;
    } else if constexpr (F == DevFormat::kMXFP4 || F == DevFormat::kQ8) {
      rc.scale_row = row * w.scale_cols;
    }
    const int64_t n_chunks = w.in / NativeChunk<F>::kElems, step = int64_t(S) * 32;
    int64_t c = int64_t(part) * 32 + lane;
    for (; c + (kUnroll - 1) * step < n_chunks; c += kUnroll * step) {
      uint4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = NativeChunk<F>::load(w, row, c + u * step);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) NativeChunk<F>::template dot<TT>(w, rc, c + u * step, v[u], x, nt, acc);
    }
    for (; c < n_chunks; c += step) NativeChunk<F>::template dot<TT>(w, rc, c, NativeChunk<F>::load(w, row, c), x, nt, acc);
  } else {  // odd rows (tests, tiny models): one element per lane per step
    for (int64_t col = int64_t(part) * 32 + lane; col < w.in; col += int64_t(S) * 32) {
      const float wv = decode_at<F>(w, row, col);
#pragma unroll
      for (int t = 0; t < TT; ++t)
        if (t < nt) acc[t] = fmaf(wv, x.x[t * x.ld + col], acc[t]);
    }
  }
}

// ---- ggml formats, int8 activations ----------------------------------------------------

// The 8 activation words of chunk c of token view a.
__device__ __forceinline__ void xq_words(const ActQ8View& a, int64_t c, int (&X)[8]) {
  const int4 lo = *reinterpret_cast<const int4*>(a.q + c * 32);
  const int4 hi = *reinterpret_cast<const int4*>(a.q + c * 32 + 16);
  X[0] = lo.x, X[1] = lo.y, X[2] = lo.z, X[3] = lo.w, X[4] = hi.x, X[5] = hi.y, X[6] = hi.z, X[7] = hi.w;
}

// Four 4-bit indices (one per byte) -> four int8 table entries; table = 16 int8
// in four words.
__device__ __forceinline__ int lut16(uint32_t n, const uint32_t (&tb)[4]) {
  const uint32_t sel = (n & 0x7u) | ((n >> 4) & 0x70u) | ((n >> 8) & 0x700u) | ((n >> 12) & 0x7000u);
  const uint32_t lo = __byte_perm(tb[0], tb[1], sel), hi = __byte_perm(tb[2], tb[3], sel);
  const uint32_t m = ((n & 0x08080808u) >> 3) * 0xffu;
  return int((lo & ~m) | (hi & m));
}

__device__ __forceinline__ void load_lut16(const int8_t* t, uint32_t (&tb)[4]) {
  const uint32_t* p = reinterpret_cast<const uint32_t*>(t);
#pragma unroll
  for (int i = 0; i < 4; ++i) tb[i] = __ldg(p + i);
}

// 8 sign bits of an IQ2 sign index (7 bits + even parity): the table kSignsIq2xs.
__device__ __forceinline__ uint32_t iq2_signs(uint32_t s7) { return s7 | ((__popc(s7) & 1u) << 7); }

// Four grid bytes with signs applied: bytes whose sign bit (bits 0..3 of s) is
// set are negated, as int8 two's complement without carries between bytes.
__device__ __forceinline__ int signed_grid4(uint32_t g, uint32_t s) {
  const uint32_t b = ((s & 0xfu) * 0x204081u) & 0x01010101u;
  const uint32_t m = b * 0xffu;
  return int((g ^ m) + b);
}

// One chunk of a ggml row: the weight bytes of the row start at rb (global
// memory, or a shared-memory copy of a group of chunks), the chunk is cl there;
// cg is its index in the row (which activations it meets). acc[t] += dot.
// Integer path (dp4a on int8 words, scales/mins per 16 or 32 elements) for
// Q8_0, Q2_K, Q3_K, Q4_K, IQ2_XXS, IQ4_XS, IQ4_NL, MXFP4; f32 decode otherwise.
template <quant::GgmlType G>
struct GgmlChunk {
  static constexpr bool kInteger =
      G == quant::GgmlType::kQ8_0 || G == quant::GgmlType::kQ2_K || G == quant::GgmlType::kQ3_K ||
      G == quant::GgmlType::kQ4_K || G == quant::GgmlType::kIQ2_XXS || G == quant::GgmlType::kIQ4_XS ||
      G == quant::GgmlType::kIQ4_NL || G == quant::GgmlType::kMXFP4;

  template <int TT>
  __device__ static void dot(const DeviceLinear& w, const uint8_t* rb, int64_t cl, int64_t cg, const uint8_t* xs_smem,
                             int nt, int64_t n, const uint32_t (&tb)[4], float (&acc)[TT]) {
    using quant::GgmlType;
    if constexpr (!kInteger) {
      float f[32];
      ggml_decode32_at(w, rb, cl, f);
#pragma unroll
      for (int t = 0; t < TT; ++t) {
        if (t < nt) {
          const ActQ8View a = act_q8_view(xs_smem, n, t);
          float p = 0.0f;
#pragma unroll
          for (int i = 0; i < 32; ++i) p = fmaf(f[i], float(a.q[cg * 32 + i]), p);
          acc[t] = fmaf(p, a.s[cg], acc[t]);
        }
      }
      return;
    } else {
    const int j = int(cl & 7);
    int W[8];
    float dl[2] = {0.0f, 0.0f}, ml[2] = {0.0f, 0.0f};  // per 16-element half: scale, min
    bool halves = false;
    float d_all = 0.0f;
    if constexpr (G == GgmlType::kQ8_0) {
      const uint8_t* b = rb + cl * 34;
      d_all = ggml_f16(b);
#pragma unroll
      for (int i = 0; i < 8; ++i) W[i] = int(ggml_u32(b + 2 + 4 * i));
    } else if constexpr (G == GgmlType::kQ2_K) {
      const uint8_t* b = rb + (cl >> 3) * 84;
      const float d = ggml_f16(b + 80), dmin = ggml_f16(b + 82);
      const uint8_t* qs = b + 16 + (j >> 2) * 32;
      const int shift = 2 * (j & 3);
#pragma unroll
      for (int i = 0; i < 8; ++i) W[i] = int((*reinterpret_cast<const uint32_t*>(qs + 4 * i) >> shift) & 0x03030303u);
      const uint32_t sc2 = ggml_u16(b + 2 * j);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t sc = (sc2 >> (8 * h)) & 0xffu;
        dl[h] = d * float(sc & 0xfu), ml[h] = dmin * float(sc >> 4);
      }
      halves = true;
    } else if constexpr (G == GgmlType::kQ3_K) {
      const uint8_t* b = rb + (cl >> 3) * 110;
      const float d = ggml_f16(b + 108);
      const uint8_t* qs = b + 32 + (j >> 2) * 32;
      const uint8_t* sc = b + 96;
      const int shift = 2 * (j & 3);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const uint32_t lo = (ggml_u32(qs + 4 * i) >> shift) & 0x03030303u;
        const uint32_t hi = (ggml_u32(b + 4 * i) >> j) & 0x01010101u;
        W[i] = int(lo | (hi << 2));  // stored value + 4 (0..7); the -4 goes through the sum of x
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int si = 2 * j + h;
        const int low4 = si < 8 ? (sc[si] & 0x0f) : (sc[si - 8] >> 4);
        const int high2 = (sc[8 + (si & 3)] >> (2 * (si >> 2))) & 3;
        dl[h] = d * float((low4 | (high2 << 4)) - 32);
        ml[h] = 4.0f * dl[h];
      }
      halves = true;
    } else if constexpr (G == GgmlType::kQ4_K) {
      const uint8_t* b = rb + (cl >> 3) * 144;
      const float d = ggml_f16(b), dmin = ggml_f16(b + 2);
      int sc, m;
      ggml_scale_min_k4(b + 4, j, sc, m);
      const uint8_t* qs = b + 16 + (j >> 1) * 32;
      const int shift = 4 * (j & 1);
#pragma unroll
      for (int i = 0; i < 8; ++i) W[i] = int((*reinterpret_cast<const uint32_t*>(qs + 4 * i) >> shift) & 0x0f0f0f0fu);
      dl[0] = dl[1] = d * float(sc);
      ml[0] = ml[1] = dmin * float(m);
      halves = true;
    } else if constexpr (G == GgmlType::kIQ4_XS || G == GgmlType::kIQ4_NL || G == GgmlType::kMXFP4) {
      uint32_t Q[4];
      if constexpr (G == GgmlType::kIQ4_XS) {
        const uint8_t* b = rb + (cl >> 3) * 136;
        const int ls = ((b[4 + j / 2] >> (4 * (j & 1))) & 0x0f) | (((ggml_u16(b + 2) >> (2 * j)) & 3) << 4);
        d_all = ggml_f16(b) * float(ls - 32);
        const uint2 v0 = *reinterpret_cast<const uint2*>(b + 8 + 16 * j);  // blocks are 8-byte aligned
        const uint2 v1 = *reinterpret_cast<const uint2*>(b + 16 + 16 * j);
        Q[0] = v0.x, Q[1] = v0.y, Q[2] = v1.x, Q[3] = v1.y;
      } else if constexpr (G == GgmlType::kIQ4_NL) {
        const uint8_t* b = rb + cl * 18;
        d_all = ggml_f16(b);
#pragma unroll
        for (int i = 0; i < 4; ++i) Q[i] = ggml_u32(b + 2 + 4 * i);
      } else {
        const uint8_t* b = rb + cl * 17;
        const uint32_t e = b[0];
        d_all = __uint_as_float(e < 2 ? (0x00200000u << e) : ((e - 1u) << 23));
#pragma unroll
        for (int i = 0; i < 4; ++i)
          Q[i] = uint32_t(b[1 + 4 * i]) | (uint32_t(b[2 + 4 * i]) << 8) | (uint32_t(b[3 + 4 * i]) << 16) |
                 (uint32_t(b[4 + 4 * i]) << 24);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        W[i] = lut16(Q[i] & 0x0f0f0f0fu, tb);
        W[4 + i] = lut16((Q[i] >> 4) & 0x0f0f0f0fu, tb);
      }
    } else if constexpr (G == GgmlType::kIQ2_XXS) {
      const uint8_t* b = rb + (cl >> 3) * 66;
      const GgmlTables* tab = reinterpret_cast<const GgmlTables*>(w.tables);
      const uint32_t grid_idx = ggml_u32(b + 2 + 8 * j), ss = ggml_u32(b + 6 + 8 * j);
      d_all = ggml_f16(b) * (0.5f + float(ss >> 28)) * 0.25f;
#pragma unroll
      for (int l = 0; l < 4; ++l) {
        const uint64_t g = __ldg(&tab->iq2xxs_grid[(grid_idx >> (8 * l)) & 0xffu]);
        const uint32_t s = iq2_signs((ss >> (7 * l)) & 127u);
        W[2 * l] = signed_grid4(uint32_t(g), s);
        W[2 * l + 1] = signed_grid4(uint32_t(g >> 32), s >> 4);
      }
    }
#pragma unroll
    for (int t = 0; t < TT; ++t) {
      if (t < nt) {
        const ActQ8View a = act_q8_view(xs_smem, n, t);
        int X[8];
        xq_words(a, cg, X);
        float v;
        if (halves) {
          int s0 = 0, s1 = 0, x0 = 0, x1 = 0;
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            s0 = __dp4a(W[i], X[i], s0);
            s1 = __dp4a(W[4 + i], X[4 + i], s1);
            x0 = __dp4a(0x01010101, X[i], x0);
            x1 = __dp4a(0x01010101, X[4 + i], x1);
          }
          v = dl[0] * float(s0) - ml[0] * float(x0) + dl[1] * float(s1) - ml[1] * float(x1);
        } else {
          int s = 0;
#pragma unroll
          for (int i = 0; i < 8; ++i) s = __dp4a(W[i], X[i], s);
          v = d_all * float(s);
        }
        acc[t] = fmaf(v, a.s[cg], acc[t]);
      }
    }
    }
  }
};

// ---- ggml row streaming through a per-warp shared-memory ring ------------------------
//
// A group is 32 consecutive chunks (4 super-blocks, or 32 small blocks): one
// chunk per lane. The warp copies each group's bytes into its ring with 8-byte
// cp.async, kGgmlRing groups ahead, so many loads are in flight without
// registers (low-bit rows have few bytes per unit of decode work); lanes then
// decode from shared memory.

constexpr int kGgmlRing = 4;            // groups in flight per warp
constexpr int64_t kGgmlGroupMax = 1088; // bytes of the largest group (Q8_0: 32 x 34)
constexpr int64_t kGgmlRingBytes = kGgmlRing * kGgmlGroupMax;  // shared memory per warp

template <quant::GgmlType G, int TT>
__device__ __forceinline__ void ggml_row_part_t(const DeviceLinear& w, int64_t row, const uint8_t* xs_smem, int nt,
                                                int part, int S, uint8_t* ring, float (&acc)[TT]) {
  const int lane = threadIdx.x & 31;
  const int64_t n_chunks = w.in / 32;
  const uint8_t* r = w.weight + row * w.row_bytes;
  uint32_t tb[4] = {0, 0, 0, 0};
  if constexpr (G == quant::GgmlType::kIQ4_XS || G == quant::GgmlType::kIQ4_NL || G == quant::GgmlType::kMXFP4) {
    const GgmlTables* tab = reinterpret_cast<const GgmlTables*>(w.tables);
    load_lut16(G == quant::GgmlType::kMXFP4 ? tab->values_mxfp4 : tab->values_iq4nl, tb);
  }
  const int64_t n_groups = n_chunks / 32;
  const int64_t group_bytes = n_groups > 0 ? w.row_bytes / n_groups : 0;
  const bool use_ring = ring && n_chunks % 32 == 0 && group_bytes % 8 == 0 && group_bytes <= kGgmlGroupMax &&
                        reinterpret_cast<uintptr_t>(r) % 8 == 0;
  if (!use_ring) {
    for (int64_t c = int64_t(part) * 32 + lane; c < n_chunks; c += int64_t(S) * 32)
      GgmlChunk<G>::template dot<TT>(w, r, c, c, xs_smem, nt, w.in, tb, acc);
    return;
  }
  const int64_t mine = n_groups > part ? (n_groups - part + S - 1) / S : 0;  // groups part, part+S, ...
  auto issue = [&](int64_t i) {
    if (i < mine) {
      const uint8_t* src = r + (part + i * S) * group_bytes;
      uint8_t* dst = ring + (i % kGgmlRing) * kGgmlGroupMax;
      for (int64_t off = int64_t(lane) * 8; off < group_bytes; off += 256) cp_async8(dst + off, src + off);
    }
    cp_async_commit();  // empty groups keep every lane's group count in step
  };
#pragma unroll
  for (int i = 0; i < kGgmlRing - 1; ++i) issue(i);
  for (int64_t i = 0; i < mine; ++i) {
    issue(i + kGgmlRing - 1);
    cp_async_wait<kGgmlRing - 1>();
    __syncwarp();
    const uint8_t* buf = ring + (i % kGgmlRing) * kGgmlGroupMax;
    const int64_t cg = (part + i * S) * 32 + lane;
    GgmlChunk<G>::template dot<TT>(w, buf, lane, cg, xs_smem, nt, w.in, tb, acc);
    __syncwarp();  // the buffer is refilled by the next iteration's issue
  }
  cp_async_wait<0>();
}

// acc[t] += the (part, lane) share of row `row` of a kGgml weight with the
// staged int8 activations (act_q8_stage of nt tokens of w.in elements). ring:
// this warp's kGgmlRingBytes of shared memory (16-byte aligned), or null to
// read the row directly.
template <int TT>
__device__ __forceinline__ void ggml_row_part(const DeviceLinear& w, int64_t row, const uint8_t* xs_smem, int nt,
                                              int part, int S, uint8_t* ring, float (&acc)[TT]) {
  using quant::GgmlType;
#define AFF_GGML_CASE(T_)                                                            \
  case GgmlType::T_:                                                                 \
    ggml_row_part_t<GgmlType::T_, TT>(w, row, xs_smem, nt, part, S, ring, acc); \
    return;
  switch (GgmlType(w.ggml_type)) {
    AFF_GGML_CASE(kQ8_0)
    AFF_GGML_CASE(kQ2_K)
    AFF_GGML_CASE(kQ3_K)
    AFF_GGML_CASE(kQ4_K)
    AFF_GGML_CASE(kIQ4_XS)
    AFF_GGML_CASE(kIQ4_NL)
    AFF_GGML_CASE(kMXFP4)
    AFF_GGML_CASE(kIQ2_XXS)
    AFF_GGML_CASE(kQ5_K)
    AFF_GGML_CASE(kQ6_K)
    AFF_GGML_CASE(kIQ2_XS)
    AFF_GGML_CASE(kIQ3_XXS)
    AFF_GGML_CASE(kIQ1_S)
    AFF_GGML_CASE(kIQ1_M)
    default: return;  // refused at upload
  }
#undef AFF_GGML_CASE
}

// Any format: native formats read f32 activations x; ggml formats read the
// staged int8 copy in xs_smem (null for native formats).
// ring: the calling warp's kGgmlRingBytes of shared memory, or null.
template <int TT>
__device__ __forceinline__ void row_part(const DeviceLinear& w, int64_t row, const ActF32& x, const uint8_t* xs_smem,
                                         int nt, int part, int S, uint8_t* ring, float (&acc)[TT]) {
  switch (w.format) {
    case DevFormat::kFP8Block: native_row_part<DevFormat::kFP8Block, TT>(w, row, x, nt, part, S, acc); return;
    case DevFormat::kMXFP4: native_row_part<DevFormat::kMXFP4, TT>(w, row, x, nt, part, S, acc); return;
    case DevFormat::kBF16: native_row_part<DevFormat::kBF16, TT>(w, row, x, nt, part, S, acc); return;
    case DevFormat::kF16: native_row_part<DevFormat::kF16, TT>(w, row, x, nt, part, S, acc); return;
    case DevFormat::kF32: native_row_part<DevFormat::kF32, TT>(w, row, x, nt, part, S, acc); return;
    case DevFormat::kQ8: native_row_part<DevFormat::kQ8, TT>(w, row, x, nt, part, S, acc); return;
    case DevFormat::kGgml: ggml_row_part<TT>(w, row, xs_smem, nt, part, S, ring, acc); return;
  }
}

// ---- compile-time decoder choice ----------------------------------------------------
//
// One kernel instantiation per decoder keeps each kernel's registers to what
// its own decoder needs (a kernel holding every decoder is sized for the
// largest and loses occupancy). kAny keeps the runtime switch (rare mixes).
enum class WPath : int {
  kAny, kFP8, kMXFP4, kBF16, kF16, kF32, kQ8,
  kQ8_0, kQ2_K, kQ3_K, kQ4_K, kIQ2_XXS, kIQ4_XS, kIQ4_NL, kMXFP4g, kGgmlOther,
};

__host__ __device__ inline WPath wpath_of(DevFormat f, int ggml_type) {
  using quant::GgmlType;
  switch (f) {
    case DevFormat::kFP8Block: return WPath::kFP8;
    case DevFormat::kMXFP4: return WPath::kMXFP4;
    case DevFormat::kBF16: return WPath::kBF16;
    case DevFormat::kF16: return WPath::kF16;
    case DevFormat::kF32: return WPath::kF32;
    case DevFormat::kQ8: return WPath::kQ8;
    case DevFormat::kGgml:
      switch (GgmlType(ggml_type)) {
        case GgmlType::kQ8_0: return WPath::kQ8_0;
        case GgmlType::kQ2_K: return WPath::kQ2_K;
        case GgmlType::kQ3_K: return WPath::kQ3_K;
        case GgmlType::kQ4_K: return WPath::kQ4_K;
        case GgmlType::kIQ2_XXS: return WPath::kIQ2_XXS;
        case GgmlType::kIQ4_XS: return WPath::kIQ4_XS;
        case GgmlType::kIQ4_NL: return WPath::kIQ4_NL;
        case GgmlType::kMXFP4: return WPath::kMXFP4g;
        default: return WPath::kGgmlOther;
      }
  }
  return WPath::kAny;
}

template <WPath P, int TT>
__device__ __forceinline__ void row_part_p(const DeviceLinear& w, int64_t row, const ActF32& x, const uint8_t* xs_smem,
                                           int nt, int part, int S, uint8_t* ring, float (&acc)[TT]) {
  using quant::GgmlType;
  if constexpr (P == WPath::kAny) row_part<TT>(w, row, x, xs_smem, nt, part, S, ring, acc);
  else if constexpr (P == WPath::kFP8) native_row_part<DevFormat::kFP8Block, TT>(w, row, x, nt, part, S, acc);
  else if constexpr (P == WPath::kMXFP4) native_row_part<DevFormat::kMXFP4, TT>(w, row, x, nt, part, S, acc);
  else if constexpr (P == WPath::kBF16) native_row_part<DevFormat::kBF16, TT>(w, row, x, nt, part, S, acc);
  else if constexpr (P == WPath::kF16) native_row_part<DevFormat::kF16, TT>(w, row, x, nt, part, S, acc);
  else if constexpr (P == WPath::kF32) native_row_part<DevFormat::kF32, TT>(w, row, x, nt, part, S, acc);
  else if constexpr (P == WPath::kQ8) native_row_part<DevFormat::kQ8, TT>(w, row, x, nt, part, S, acc);
  else if constexpr (P == WPath::kQ8_0) ggml_row_part_t<GgmlType::kQ8_0, TT>(w, row, xs_smem, nt, part, S, ring, acc);
  else if constexpr (P == WPath::kQ2_K) ggml_row_part_t<GgmlType::kQ2_K, TT>(w, row, xs_smem, nt, part, S, ring, acc);
  else if constexpr (P == WPath::kQ3_K) ggml_row_part_t<GgmlType::kQ3_K, TT>(w, row, xs_smem, nt, part, S, ring, acc);
  else if constexpr (P == WPath::kQ4_K) ggml_row_part_t<GgmlType::kQ4_K, TT>(w, row, xs_smem, nt, part, S, ring, acc);
  else if constexpr (P == WPath::kIQ2_XXS) ggml_row_part_t<GgmlType::kIQ2_XXS, TT>(w, row, xs_smem, nt, part, S, ring, acc);
  else if constexpr (P == WPath::kIQ4_XS) ggml_row_part_t<GgmlType::kIQ4_XS, TT>(w, row, xs_smem, nt, part, S, ring, acc);
  else if constexpr (P == WPath::kIQ4_NL) ggml_row_part_t<GgmlType::kIQ4_NL, TT>(w, row, xs_smem, nt, part, S, ring, acc);
  else if constexpr (P == WPath::kMXFP4g) ggml_row_part_t<GgmlType::kMXFP4, TT>(w, row, xs_smem, nt, part, S, ring, acc);
  else ggml_row_part<TT>(w, row, xs_smem, nt, part, S, ring, acc);
}

}  // namespace aff::cuda
