// Device decoding of ggml block formats, 32 elements (one "chunk") at a time:
// chunk c of a row is elements [32c, 32c + 32). For the 256-element K and IQ
// formats a chunk is sub-block c % 8 of super-block c / 8; for the 32-element
// formats (Q8_0, IQ4_NL, MXFP4) it is one block. Element order and arithmetic
// follow the reference decoders in src/quant/ (bit-compatible with ggml), so a
// decoded value equals the CPU reference's up to float rounding of d * q.
//
// Blocks are only 2-byte aligned in general (e.g. Q3_K is 110 bytes), so words
// are read as aligned u16 pairs; MXFP4 blocks (17 bytes) are read bytewise.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/kernels/common/ggml_tables.h"
#include "backend/cuda/runtime/device_weights.h"
#include "quant/type_traits.h"

namespace aff::cuda {

__device__ __forceinline__ float ggml_f16(const uint8_t* p) {
  return __half2float(__ushort_as_half(*reinterpret_cast<const uint16_t*>(p)));
}
__device__ __forceinline__ uint32_t ggml_u16(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }
// A u32 at a 2-byte aligned address.
__device__ __forceinline__ uint32_t ggml_u32(const uint8_t* p) {
  const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
  return uint32_t(h[0]) | (uint32_t(h[1]) << 16);
}

// 8 values db * grid byte j * sign j (codebook formats).
__device__ __forceinline__ void ggml_emit8_signed(float db, uint64_t grid, uint32_t signs, float* y) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float g = float(uint32_t(grid >> (8 * j)) & 0xffu);
    y[j] = ((signs >> j) & 1u) ? -db * g : db * g;
  }
}

// Q4_K/Q5_K 6-bit scale and min of sub-block j from the 12 packed bytes.
__device__ __forceinline__ void ggml_scale_min_k4(const uint8_t* s, int j, int& sc, int& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// out[0..32) = elements [32*chunk, 32*chunk + 32) of the row whose bytes start at
// r (global or shared memory) of the kGgml weight w (its type and tables).
__device__ __forceinline__ void ggml_decode32_at(const DeviceLinear& w, const uint8_t* r, int64_t chunk, float* out) {
  using quant::GgmlType;
  const GgmlTables* tab = reinterpret_cast<const GgmlTables*>(w.tables);
  const int j = int(chunk & 7);  // sub-block within a 256-element super-block
  switch (GgmlType(w.ggml_type)) {
    case GgmlType::kQ8_0: {  // 34-byte blocks: f16 d, 32 x int8
      const uint8_t* b = r + chunk * 34;
      const float d = ggml_f16(b);
#pragma unroll
      for (int i = 0; i < 32; i += 2) {
        const uint32_t q = ggml_u16(b + 2 + i);
        out[i] = d * float(int8_t(q & 0xffu));
        out[i + 1] = d * float(int8_t(q >> 8));
      }
      return;
    }
    case GgmlType::kMXFP4: {  // 17-byte blocks: E8M0 e, 16 bytes (element i low, i+16 high)
      const uint8_t* b = r + chunk * 17;
      const uint32_t e = b[0];
      // 2^(e-128): ggml halves the scale because its E2M1 table is doubled.
      const float d = __uint_as_float(e < 2 ? (0x00200000u << e) : ((e - 1u) << 23));
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const uint32_t q = b[1 + i];
        out[i] = float(tab->values_mxfp4[q & 0xfu]) * d;
        out[i + 16] = float(tab->values_mxfp4[q >> 4]) * d;
      }
      return;
    }
    case GgmlType::kIQ4_NL: {  // 18-byte blocks: f16 d, 16 bytes
      const uint8_t* b = r + chunk * 18;
      const float d = ggml_f16(b);
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const uint32_t q = b[2 + i];
        out[i] = d * float(tab->values_iq4nl[q & 0xfu]);
        out[i + 16] = d * float(tab->values_iq4nl[q >> 4]);
      }
      return;
    }
    case GgmlType::kQ2_K: {  // 84 bytes: scales[16], qs[64], d, dmin
      const uint8_t* b = r + (chunk >> 3) * 84;
      const float d = ggml_f16(b + 80), dmin = ggml_f16(b + 82);
      const uint8_t* qs = b + 16 + (j >> 2) * 32;
      const int shift = 2 * (j & 3);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t sc = b[2 * j + h];
        const float dl = d * float(sc & 0xfu), ml = dmin * float(sc >> 4);
#pragma unroll
        for (int i = 0; i < 16; i += 4) {
          const uint32_t q = (*reinterpret_cast<const uint32_t*>(qs + 16 * h + i) >> shift) & 0x03030303u;
#pragma unroll
          for (int k = 0; k < 4; ++k) out[16 * h + i + k] = dl * float((q >> (8 * k)) & 0xffu) - ml;
        }
      }
      return;
    }
    case GgmlType::kQ3_K: {  // 110 bytes: hmask[32], qs[64], scales[12], d
      const uint8_t* b = r + (chunk >> 3) * 110;
      const float d = ggml_f16(b + 108);
      const uint8_t* qs = b + 32 + (j >> 2) * 32;
      const uint8_t* sc = b + 96;
      const int shift = 2 * (j & 3);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int si = 2 * j + h;
        const int low4 = si < 8 ? (sc[si] & 0x0f) : (sc[si - 8] >> 4);
        const int high2 = (sc[8 + (si & 3)] >> (2 * (si >> 2))) & 3;
        const float dl = d * float((low4 | (high2 << 4)) - 32);
#pragma unroll
        for (int i = 0; i < 16; i += 2) {
          const uint32_t q = ggml_u16(qs + 16 * h + i) >> shift;
          const uint32_t hm = ggml_u16(b + 16 * h + i) >> j;
#pragma unroll
          for (int k = 0; k < 2; ++k) {
            const int low = int((q >> (8 * k)) & 3u);
            const int high = int((hm >> (8 * k)) & 1u);
            out[16 * h + i + k] = dl * float(low - (high ? 0 : 4));
          }
        }
      }
      return;
    }
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K: {  // d, dmin, scales[12], (Q5_K: qh[32],) qs[128]
      const bool q5 = GgmlType(w.ggml_type) == GgmlType::kQ5_K;
      const uint8_t* b = r + (chunk >> 3) * (q5 ? 176 : 144);
      const float d = ggml_f16(b), dmin = ggml_f16(b + 2);
      int sc, m;
      ggml_scale_min_k4(b + 4, j, sc, m);
      const float dl = d * float(sc), ml = dmin * float(m);
      const uint8_t* qh = b + 16;
      const uint8_t* qs = b + (q5 ? 48 : 16) + (j >> 1) * 32;
      const int shift = 4 * (j & 1);
#pragma unroll
      for (int i = 0; i < 32; i += 4) {
        const uint32_t q = (*reinterpret_cast<const uint32_t*>(qs + i) >> shift) & 0x0f0f0f0fu;
        const uint32_t hb = q5 ? ((*reinterpret_cast<const uint32_t*>(qh + i) >> j) & 0x01010101u) << 4 : 0u;
#pragma unroll
        for (int k = 0; k < 4; ++k) out[i + k] = dl * float(((q | hb) >> (8 * k)) & 0xffu) - ml;
      }
      return;
    }
    case GgmlType::kQ6_K: {  // 210 bytes: ql[128], qh[64], scales[16] (int8), d
      const uint8_t* b = r + (chunk >> 3) * 210;
      const float d = ggml_f16(b + 208);
      const int h = j >> 2, q4 = j & 3;
      const uint8_t* ql = b + h * 64 + 32 * (q4 & 1);
      const uint8_t* qh = b + 128 + h * 32;
      const int lshift = 4 * (q4 >> 1), hshift = 2 * q4;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float dl = d * float(int8_t(b[192 + 2 * j + half]));
#pragma unroll
        for (int i = 0; i < 16; i += 2) {
          const int l = 16 * half + i;
          const uint32_t lo = ggml_u16(ql + l) >> lshift;
          const uint32_t hi = ggml_u16(qh + l) >> hshift;
#pragma unroll
          for (int k = 0; k < 2; ++k) {
            const int q = int(((lo >> (8 * k)) & 0xfu) | (((hi >> (8 * k)) & 3u) << 4));
            out[l + k] = dl * float(q - 32);
          }
        }
      }
      return;
    }
    case GgmlType::kIQ4_XS: {  // 136 bytes: d, scales_h (u16), scales_l[4], qs[128]
      const uint8_t* b = r + (chunk >> 3) * 136;
      const float d = ggml_f16(b);
      const int ls = ((b[4 + j / 2] >> (4 * (j & 1))) & 0x0f) | (((ggml_u16(b + 2) >> (2 * j)) & 3) << 4);
      const float dl = d * float(ls - 32);
      const uint8_t* qs = b + 8 + 16 * j;
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const uint32_t q = qs[i];
        out[i] = dl * float(tab->values_iq4nl[q & 0xfu]);
        out[i + 16] = dl * float(tab->values_iq4nl[q >> 4]);
      }
      return;
    }
    case GgmlType::kIQ2_XXS: {  // 66 bytes: d, then per 32: u32 grid indices, u32 signs | scale << 28
      const uint8_t* b = r + (chunk >> 3) * 66;
      const float d = ggml_f16(b);
      const uint32_t grid_idx = ggml_u32(b + 2 + 8 * j);
      const uint32_t sign_scale = ggml_u32(b + 2 + 8 * j + 4);
      const float db = d * (0.5f + float(sign_scale >> 28)) * 0.25f;
#pragma unroll
      for (int l = 0; l < 4; ++l)
        ggml_emit8_signed(db, tab->iq2xxs_grid[(grid_idx >> (8 * l)) & 0xffu],
                          tab->signs_iq2xs[(sign_scale >> (7 * l)) & 127u], out + 8 * l);
      return;
    }
    case GgmlType::kIQ2_XS: {  // 74 bytes: d, qs[32] (u16: 9-bit grid | 7-bit sign << 9), scales[8]
      const uint8_t* b = r + (chunk >> 3) * 74;
      const float d = ggml_f16(b);
      const uint32_t s = b[2 + 64 + j];
      const float db0 = d * (0.5f + float(s & 0xfu)) * 0.25f, db1 = d * (0.5f + float(s >> 4)) * 0.25f;
#pragma unroll
      for (int l = 0; l < 4; ++l) {
        const uint32_t q = ggml_u16(b + 2 + 2 * (4 * j + l));
        ggml_emit8_signed(l < 2 ? db0 : db1, tab->iq2xs_grid[q & 511u], tab->signs_iq2xs[q >> 9], out + 8 * l);
      }
      return;
    }
    case GgmlType::kIQ3_XXS: {  // 98 bytes: d, grid indices[64], per 32 a u32 signs | scale << 28
      const uint8_t* b = r + (chunk >> 3) * 98;
      const float d = ggml_f16(b);
      const uint32_t sign_scale = ggml_u32(b + 2 + 64 + 4 * j);
      const float db = d * (0.5f + float(sign_scale >> 28)) * 0.5f;
#pragma unroll
      for (int l = 0; l < 4; ++l) {
        const uint64_t g = uint64_t(tab->iq3xxs_grid[b[2 + 8 * j + 2 * l]]) |
                           (uint64_t(tab->iq3xxs_grid[b[2 + 8 * j + 2 * l + 1]]) << 32);
        ggml_emit8_signed(db, g, tab->signs_iq2xs[(sign_scale >> (7 * l)) & 127u], out + 8 * l);
      }
      return;
    }
    case GgmlType::kIQ1_S: {  // 50 bytes: d, qs[32], qh[8] (u16)
      const uint8_t* b = r + (chunk >> 3) * 50;
      const float d = ggml_f16(b);
      const uint32_t qh = ggml_u16(b + 2 + 32 + 2 * j);
      const float dl = d * float(2 * ((qh >> 12) & 7u) + 1);
      const float delta = (qh & 0x8000u) ? -0.125f : 0.125f;
#pragma unroll
      for (int l = 0; l < 4; ++l) {
        const uint64_t g = tab->iq1s_grid[b[2 + 4 * j + l] | (((qh >> (3 * l)) & 7u) << 8)];
#pragma unroll
        for (int k = 0; k < 8; ++k) out[8 * l + k] = dl * (float(int8_t(uint8_t(g >> (8 * k)))) + delta);
      }
      return;
    }
    case GgmlType::kIQ1_M: {  // 56 bytes: qs[32], qh[16], scales[8] (4 u16, f16 d in the top nibbles)
      const uint8_t* b = r + (chunk >> 3) * 56;
      const uint32_t s0 = ggml_u16(b + 48), s1 = ggml_u16(b + 50), s2 = ggml_u16(b + 52), s3 = ggml_u16(b + 54);
      const uint32_t d_bits = (s0 >> 12) | ((s1 >> 8) & 0x00f0u) | ((s2 >> 4) & 0x0f00u) | (s3 & 0xf000u);
      const float d = __half2float(__ushort_as_half(uint16_t(d_bits)));
      const uint32_t sw = ggml_u16(b + 48 + 2 * (j / 2));
      const int shift = 6 * (j & 1);
      const float dl0 = d * float(2 * ((sw >> shift) & 7u) + 1), dl1 = d * float(2 * ((sw >> (shift + 3)) & 7u) + 1);
#pragma unroll
      for (int l = 0; l < 4; ++l) {
        const uint32_t nib = (uint32_t(b[32 + 2 * j + l / 2]) >> (4 * (l & 1))) & 0xfu;
        const uint64_t g = tab->iq1s_grid[b[4 * j + l] | ((nib & 7u) << 8)];
        const float delta = (nib & 8u) ? -0.125f : 0.125f;
        const float dl = l < 2 ? dl0 : dl1;
#pragma unroll
        for (int k = 0; k < 8; ++k) out[8 * l + k] = dl * (float(int8_t(uint8_t(g >> (8 * k)))) + delta);
      }
      return;
    }
    default: {  // refused at upload; never reached
#pragma unroll
      for (int i = 0; i < 32; ++i) out[i] = __uint_as_float(0x7fc00000u);
      return;
    }
  }
}

// out[0..32) = elements [32*chunk, 32*chunk + 32) of row `row` of the kGgml weight w.
__device__ __forceinline__ void ggml_decode32(const DeviceLinear& w, int64_t row, int64_t chunk, float* out) {
  ggml_decode32_at(w, w.weight + row * w.row_bytes, chunk, out);
}

}  // namespace aff::cuda
