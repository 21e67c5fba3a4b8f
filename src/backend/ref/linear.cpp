#include "backend/ref/linear.h"

#include <algorithm>
#include <vector>

#include "backend/cpu/linear_fast.h"
#include "backend/ref/vec.h"
#include "core/check.h"
#include "core/dtype.h"
#include "quant/codec.h"

namespace aff::ref {
namespace {

// A scale element of any dtype a checkpoint uses for scales (E8M0 in the
// official layout; F32/BF16 accepted for HF-style `weight_scale_inv`).
float scale_at(const TensorView& s, int64_t i) {
  switch (s.dtype) {
    case DType::kF8E8M0: return e8m0_to_f32(s.as<uint8_t>()[i]);
    case DType::kF32: return s.as<float>()[i];
    case DType::kBF16: return bf16_to_f32(s.as<uint16_t>()[i]);
    default: break;
  }
  AFF_CHECK(!"unsupported scale dtype");
  return 0.0f;
}

// s[k] = w . x_k for the four vectors x_k = x + k*ldx; w, x_k: [n]. Loads
// each weight once for four tokens.
inline void dot4(const float* w, const float* x, int64_t ldx, int64_t n, float* s) {
  const float *x0 = x, *x1 = x + ldx, *x2 = x + 2 * ldx, *x3 = x + 3 * ldx;
  float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
  for (int64_t i = 0; i < n; ++i) {
    const float wi = w[i];
    s0 += wi * x0[i];
    s1 += wi * x1[i];
    s2 += wi * x2[i];
    s3 += wi * x3[i];
  }
  s[0] = s0, s[1] = s1, s[2] = s2, s[3] = s3;
}

// Rows dequantised per tile: one tile of weights is reused across all T tokens.
constexpr int64_t kRowTile = 8;

}  // namespace

void linear_dequant_row(const dsv4::Linear& w, int64_t row, float* out) {
  const int64_t in = w.in;
  switch (w.format) {
    case dsv4::WeightFormat::kF32: {
      const float* p = w.weight.as<float>() + row * in;
      std::copy(p, p + in, out);
      return;
    }
    case dsv4::WeightFormat::kBF16: {
      const uint16_t* p = w.weight.as<uint16_t>() + row * in;
      for (int64_t i = 0; i < in; ++i) out[i] = bf16_to_f32(p[i]);
      return;
    }
    case dsv4::WeightFormat::kF16: {
      const uint16_t* p = w.weight.as<uint16_t>() + row * in;
      for (int64_t i = 0; i < in; ++i) out[i] = f16_to_f32(p[i]);
      return;
    }
    case dsv4::WeightFormat::kFP8Block: {
      // scale: [ceil(out/B), ceil(in/B)]; one scale per B x B tile.
      const int64_t B = w.block;
      const int64_t scale_cols = (in + B - 1) / B;
      const uint8_t* p = w.weight.as<uint8_t>() + row * in;
      const int64_t srow = (row / B) * scale_cols;
      for (int64_t c0 = 0; c0 < in; c0 += B) {
        const float s = scale_at(w.scale, srow + c0 / B);
        const int64_t c1 = std::min(in, c0 + B);
        for (int64_t i = c0; i < c1; ++i) out[i] = e4m3_to_f32(p[i]) * s;
      }
      return;
    }
    case dsv4::WeightFormat::kGgml: {
      // weight: [out, row_bytes] ggml blocks (GGUF); decoded exactly as ggml does.
      const int64_t row_bytes = w.weight.shape.at(1);
      const Status st = quant::dequantize_row(quant::GgmlType(w.ggml_type),
                                              {w.weight.data + row * row_bytes, size_t(row_bytes)},
                                              {out, size_t(in)});
      AFF_CHECK(st.is_ok());  // the loader validated type and row size
      return;
    }
    case dsv4::WeightFormat::kMXFP4: {
      // weight: [out, in/2] bytes, low nibble = even column; scale: [out, in/32].
      const uint8_t* p = w.weight.as<uint8_t>() + row * (in / 2);
      const int64_t scale_cols = in / 32;
      for (int64_t c0 = 0; c0 < in; c0 += 32) {
        const float s = scale_at(w.scale, row * scale_cols + c0 / 32);
        for (int64_t i = c0; i < c0 + 32; i += 2) {
          const uint8_t b = p[i / 2];
          out[i] = kE2M1ToF32[b & 0xf] * s;
          out[i + 1] = kE2M1ToF32[b >> 4] * s;
        }
      }
      return;
    }
  }
  AFF_CHECK(!"unknown weight format");
}

void linear_rows(const dsv4::Linear& w, int64_t row_begin, int64_t row_end, const float* x,
                 int64_t ldx, int64_t T, float* y, int64_t ldy) {
  AFF_CHECK(w.valid());
  AFF_CHECK(row_begin >= 0 && row_begin <= row_end && row_end <= w.out);
  const int64_t in = w.in;
  const int64_t n_rows = row_end - row_begin;
  const int64_t n_tiles = (n_rows + kRowTile - 1) / kRowTile;
  if (n_rows == 0 || T == 0) return;
  // ggml blocks with a SIMD kernel go to the CPU lane (quantised activations); AFF_CPU_LANE=0
  // keeps them on the row-dequantising path below.
  if (w.format == dsv4::WeightFormat::kGgml && cpu::linear_fast_rows(w, row_begin, row_end, x, ldx, T, y, ldy)) return;
#pragma omp parallel if (n_rows * in * T >= kParallelMinWork)
  {
    std::vector<float> tile(size_t(kRowTile * in));
#pragma omp for schedule(static)
    for (int64_t tile_i = 0; tile_i < n_tiles; ++tile_i) {
      const int64_t r0 = row_begin + tile_i * kRowTile;
      const int64_t r1 = std::min(row_end, r0 + kRowTile);
      for (int64_t r = r0; r < r1; ++r) linear_dequant_row(w, r, tile.data() + (r - r0) * in);
      int64_t t = 0;
      for (; t + 4 <= T; t += 4) {  // four tokens per pass over a weight row
        for (int64_t r = r0; r < r1; ++r) {
          float s[4];
          dot4(tile.data() + (r - r0) * in, x + t * ldx, ldx, in, s);
          for (int k = 0; k < 4; ++k) y[(t + k) * ldy + r - row_begin] = s[k];
        }
      }
      for (; t < T; ++t) {
        const float* xt = x + t * ldx;
        float* yt = y + t * ldy - row_begin;
        for (int64_t r = r0; r < r1; ++r) yt[r] = dot(tile.data() + (r - r0) * in, xt, in);
      }
    }
  }
}

void linear(const dsv4::Linear& w, const float* x, int64_t T, float* y) {
  linear_rows(w, 0, w.out, x, w.in, T, y, w.out);
}

}  // namespace aff::ref
