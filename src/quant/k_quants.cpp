// K-quants: 256-element super-blocks whose sub-block scales are themselves quantised
// against one or two f16 super-scales. Q2_K, Q3_K, Q4_K decode and encode; Q5_K and Q6_K
// decode only (they appear in community files). Element order within a block follows
// ggml exactly; comments give it as a function of the flat index f in [0, 256).
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "quant/formats.h"
#include "quant/scale_search.h"

namespace aff::quant {
namespace {

// Q4_K/Q5_K 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes:
// j < 4: low 6 bits of bytes j (scale) and j+4 (min); j >= 4: low/high nibble of byte
// j+4 plus the top 2 bits of bytes j-4 (scale) and j (min).
void unpack_scale_min_k4(const uint8_t* s, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

void pack_scale_min_k4(uint8_t* s, int j, int sc, int m) {
  if (j < 4) {
    s[j] = uint8_t((s[j] & 0xc0) | sc);
    s[j + 4] = uint8_t((s[j + 4] & 0xc0) | m);
  } else {
    s[j + 4] = uint8_t((sc & 0x0f) | ((m & 0x0f) << 4));
    s[j - 4] = uint8_t((s[j - 4] & 0x3f) | ((sc >> 4) << 6));
    s[j] = uint8_t((s[j] & 0x3f) | ((m >> 4) << 6));
  }
}

// Q3_K signed scale of sub-block i (0..15): low nibble from byte i (i < 8) or the high
// nibble of byte i-8, two high bits from byte 8 + i%4 at shift 2*(i/4); stored +32.
int unpack_scale_q3_k(const uint8_t* s, int i) {
  const int low = i < 8 ? (s[i] & 0x0f) : (s[i - 8] >> 4);
  const int high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
  return (low | (high << 4)) - 32;
}

const float* weights_at(const float* imp, int64_t offset) { return imp ? imp + offset : nullptr; }

// Quantises sub-block (scale, min) pairs against two super-scales with `bits`-bit codes.
// Returns d and dmin as stored (f16-rounded) and fills the codes.
void quantize_scale_mins(const ScaleMin* sm, int n_sub, int bits, uint16_t* d_out,
                         uint16_t* dmin_out, int* sc_codes, int* m_codes) {
  const int qmax = (1 << bits) - 1;
  float max_scale = 0.0f, max_min = 0.0f;
  for (int j = 0; j < n_sub; ++j) {
    max_scale = std::fmax(max_scale, sm[j].scale);
    max_min = std::fmax(max_min, sm[j].min);
  }
  *d_out = f32_to_f16(max_scale / float(qmax));
  *dmin_out = f32_to_f16(max_min / float(qmax));
  const float d = f16_to_f32(*d_out), dmin = f16_to_f32(*dmin_out);
  for (int j = 0; j < n_sub; ++j) {
    sc_codes[j] = d > 0.0f ? round_clamp(sm[j].scale / d, 0, qmax) : 0;
    m_codes[j] = dmin > 0.0f ? round_clamp(sm[j].min / dmin, 0, qmax) : 0;
  }
}

}  // namespace

// ---- decoders --------------------------------------------------------------------------

void dequantize_row_q2_k(const BlockQ2K* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float d = f16_to_f32(x[b].d), dmin = f16_to_f32(x[b].dmin);
    float* yb = y + b * kQK_K;
    // f: sub-block f/16; 2 bits of qs[(f/128)*32 + f%32] at shift 2*((f%128)/32).
    for (int f = 0; f < kQK_K; ++f) {
      const uint8_t sc = x[b].scales[f / 16];
      const float dl = d * float(sc & 0x0f), ml = dmin * float(sc >> 4);
      const int q = (x[b].qs[(f / 128) * 32 + f % 32] >> (2 * ((f % 128) / 32))) & 3;
      yb[f] = dl * float(q) - ml;
    }
  }
}

void dequantize_row_q3_k(const BlockQ3K* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float d = f16_to_f32(x[b].d);
    float* yb = y + b * kQK_K;
    // f: sub-block f/16; low 2 bits as in Q2_K; high bit = bit f/32 of hmask[f%32],
    // and a clear high bit means the value is offset by -4.
    for (int f = 0; f < kQK_K; ++f) {
      const float dl = d * float(unpack_scale_q3_k(x[b].scales, f / 16));
      const int low = (x[b].qs[(f / 128) * 32 + f % 32] >> (2 * ((f % 128) / 32))) & 3;
      const int high = (x[b].hmask[f % 32] >> (f / 32)) & 1;
      yb[f] = dl * float(low - (high ? 0 : 4));
    }
  }
}

void dequantize_row_q4_k(const BlockQ4K* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float d = f16_to_f32(x[b].d), dmin = f16_to_f32(x[b].dmin);
    float* yb = y + b * kQK_K;
    // Sub-block j (32 elements): nibble (j%2) of qs[(j/2)*32 + l].
    for (int j = 0; j < 8; ++j) {
      int sc, m;
      unpack_scale_min_k4(x[b].scales, j, &sc, &m);
      const float dl = d * float(sc), ml = dmin * float(m);
      for (int l = 0; l < 32; ++l) {
        const int q = (x[b].qs[(j / 2) * 32 + l] >> (4 * (j % 2))) & 0x0f;
        yb[j * 32 + l] = dl * float(q) - ml;
      }
    }
  }
}

void dequantize_row_q5_k(const BlockQ5K* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float d = f16_to_f32(x[b].d), dmin = f16_to_f32(x[b].dmin);
    float* yb = y + b * kQK_K;
    // As Q4_K, plus a fifth bit: bit j of qh[l] for sub-block j.
    for (int j = 0; j < 8; ++j) {
      int sc, m;
      unpack_scale_min_k4(x[b].scales, j, &sc, &m);
      const float dl = d * float(sc), ml = dmin * float(m);
      for (int l = 0; l < 32; ++l) {
        const int q = ((x[b].qs[(j / 2) * 32 + l] >> (4 * (j % 2))) & 0x0f) |
                      (((x[b].qh[l] >> j) & 1) << 4);
        yb[j * 32 + l] = dl * float(q) - ml;
      }
    }
  }
}

void dequantize_row_q6_k(const BlockQ6K* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float d = f16_to_f32(x[b].d);
    float* yb = y + b * kQK_K;
    // f: half h = f/128, r = f%128; low 4 bits = nibble (r/64) of ql[h*64 + r%64];
    // high 2 bits at shift 2*(r/32) of qh[h*32 + r%32]; value stored +32.
    for (int f = 0; f < kQK_K; ++f) {
      const int h = f / 128, r = f % 128;
      const int low = (x[b].ql[h * 64 + r % 64] >> (4 * (r / 64))) & 0x0f;
      const int high = (x[b].qh[h * 32 + r % 32] >> (2 * (r / 32))) & 3;
      const float dl = d * float(x[b].scales[f / 16]);
      yb[f] = dl * float((low | (high << 4)) - 32);
    }
  }
}

// ---- encoders --------------------------------------------------------------------------

void quantize_row_q2_k(const float* x, BlockQ2K* y, int64_t n, const float* imp) {
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float* xb = x + b * kQK_K;
    const float* wb = weights_at(imp, b * kQK_K);
    ScaleMin sm[16];
    for (int j = 0; j < 16; ++j) sm[j] = fit_scale_min(xb + 16 * j, wb ? wb + 16 * j : nullptr, 16, 3);
    int sc[16], m[16];
    std::memset(&y[b], 0, sizeof(BlockQ2K));
    quantize_scale_mins(sm, 16, 4, &y[b].d, &y[b].dmin, sc, m);
    const float d = f16_to_f32(y[b].d), dmin = f16_to_f32(y[b].dmin);
    for (int j = 0; j < 16; ++j) y[b].scales[j] = uint8_t(sc[j] | (m[j] << 4));
    for (int f = 0; f < kQK_K; ++f) {
      const float dl = d * float(sc[f / 16]), ml = dmin * float(m[f / 16]);
      const int q = dl > 0.0f ? round_clamp((xb[f] + ml) / dl, 0, 3) : 0;
      y[b].qs[(f / 128) * 32 + f % 32] |= uint8_t(q << (2 * ((f % 128) / 32)));
    }
  }
}

void quantize_row_q4_k(const float* x, BlockQ4K* y, int64_t n, const float* imp) {
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float* xb = x + b * kQK_K;
    const float* wb = weights_at(imp, b * kQK_K);
    ScaleMin sm[8];
    for (int j = 0; j < 8; ++j) sm[j] = fit_scale_min(xb + 32 * j, wb ? wb + 32 * j : nullptr, 32, 15);
    int sc[8], m[8];
    std::memset(&y[b], 0, sizeof(BlockQ4K));
    quantize_scale_mins(sm, 8, 6, &y[b].d, &y[b].dmin, sc, m);
    const float d = f16_to_f32(y[b].d), dmin = f16_to_f32(y[b].dmin);
    for (int j = 0; j < 8; ++j) {
      pack_scale_min_k4(y[b].scales, j, sc[j], m[j]);
      const float dl = d * float(sc[j]), ml = dmin * float(m[j]);
      for (int l = 0; l < 32; ++l) {
        const int q = dl > 0.0f ? round_clamp((xb[32 * j + l] + ml) / dl, 0, 15) : 0;
        y[b].qs[(j / 2) * 32 + l] |= uint8_t(q << (4 * (j % 2)));
      }
    }
  }
}

void quantize_row_q3_k(const float* x, BlockQ3K* y, int64_t n, const float* imp) {
  static constexpr float kLevels[8] = {-4, -3, -2, -1, 0, 1, 2, 3};
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float* xb = x + b * kQK_K;
    const float* wb = weights_at(imp, b * kQK_K);
    float scales[16];
    float big = 0.0f;
    for (int j = 0; j < 16; ++j) {
      scales[j] = fit_scale_levels(xb + 16 * j, wb ? wb + 16 * j : nullptr, 16, kLevels, 8);
      if (std::fabs(scales[j]) > std::fabs(big)) big = scales[j];
    }
    std::memset(&y[b], 0, sizeof(BlockQ3K));
    // The largest sub-scale takes code -32, the long end of the signed 6-bit range.
    y[b].d = f32_to_f16(big / -32.0f);
    const float d = f16_to_f32(y[b].d);
    for (int j = 0; j < 16; ++j) {
      const int code = d != 0.0f ? round_clamp(scales[j] / d, -32, 31) : 0;
      const int stored = code + 32;
      if (j < 8) {
        y[b].scales[j] |= uint8_t(stored & 0x0f);
      } else {
        y[b].scales[j - 8] |= uint8_t((stored & 0x0f) << 4);
      }
      y[b].scales[8 + j % 4] |= uint8_t((stored >> 4) << (2 * (j / 4)));
      const float dl = d * float(code);
      for (int l = 0; l < 16; ++l) {
        const int f = 16 * j + l;
        const int q = (dl != 0.0f ? round_clamp(xb[f] / dl, -4, 3) : 0) + 4;
        y[b].qs[(f / 128) * 32 + f % 32] |= uint8_t((q & 3) << (2 * ((f % 128) / 32)));
        y[b].hmask[f % 32] |= uint8_t((q >> 2) << (f / 32));
      }
    }
  }
}

}  // namespace aff::quant
