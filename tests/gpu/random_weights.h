// Random weights for the GPU tests. ggml formats: quantised from Gaussian values
// where affinity has a quantiser, else random bytes with every f16 scale field
// rewritten to a finite, moderate value (random scale bits would give inf/NaN).
// Checkpoint formats (FP8 block, MXFP4, BF16, F32): random codes and scales.
#pragma once

#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/dsv4/weights.h"
#include "quant/codec.h"
#include "quant/type_traits.h"

namespace aff::cuda::testing {

using Keep = std::vector<std::shared_ptr<std::vector<uint8_t>>>;

// Byte offsets of the f16 scale fields in one block of `t` (empty: none or not f16).
inline std::vector<int> ggml_f16_fields(quant::GgmlType t) {
  using T = quant::GgmlType;
  switch (t) {
    case T::kQ5_K: return {0, 2};
    case T::kQ6_K: return {208};
    case T::kIQ2_XXS:
    case T::kIQ2_XS:
    case T::kIQ3_XXS:
    case T::kIQ1_S: return {0};
    default: return {};
  }
}

// W [out, in] in ggml type `t` (in a multiple of its block size), bytes owned by keep.
inline dsv4::Linear random_ggml_linear(quant::GgmlType t, int64_t out, int64_t in, std::mt19937_64& rng,
                                       Keep& keep, const std::string& name = "test.ggml") {
  const quant::GgmlTypeTraits& tr = quant::ggml_traits(t);
  const int64_t row_bytes = *quant::ggml_row_bytes(t, in);
  keep.push_back(std::make_shared<std::vector<uint8_t>>(size_t(out * row_bytes)));
  uint8_t* data = keep.back()->data();
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> byte(0, 255);
  if (tr.can_quantize) {
    std::vector<float> row(static_cast<size_t>(in));
    for (int64_t r = 0; r < out; ++r) {
      for (float& v : row) v = nd(rng) * 0.05f;
      const Status st = quant::quantize_row(t, row, {data + r * row_bytes, size_t(row_bytes)});
      if (!st.is_ok()) throw std::runtime_error(st.message());
    }
  } else {
    for (int64_t i = 0; i < out * row_bytes; ++i) data[i] = uint8_t(byte(rng));
    // Codebook magnitudes reach ~40 and sub-scales ~4: d this small keeps elements
    // near the quantised Gaussian's scale (0.05), as trained weights are.
    std::uniform_real_distribution<float> scale(0.0005f, 0.004f);
    const int64_t n_blocks = out * row_bytes / tr.block_bytes;
    for (int64_t b = 0; b < n_blocks; ++b) {
      uint8_t* blk = data + b * tr.block_bytes;
      for (int off : ggml_f16_fields(t)) {
        const uint16_t h = f32_to_f16(scale(rng));
        std::memcpy(blk + off, &h, 2);
      }
      if (t == quant::GgmlType::kIQ1_M) {  // f16 d = top nibbles of the four scale words
        blk[49] = uint8_t((blk[49] & 0x0f) | 0x00);
        blk[51] = uint8_t((blk[51] & 0x0f) | (uint8_t(byte(rng) & 0xf) << 4));
        blk[53] = uint8_t((blk[53] & 0x0f) | (uint8_t(byte(rng) & 0x3) << 4));
        blk[55] = uint8_t((blk[55] & 0x0f) | 0x20);
      }
    }
  }
  dsv4::Linear w;
  w.format = dsv4::WeightFormat::kGgml;
  w.ggml_type = int(t);
  w.out = out, w.in = in;
  w.weight.name = name, w.weight.file = "<random>";
  w.weight.dtype = DType::kU8;
  w.weight.shape = {out, row_bytes};
  w.weight.data = data;
  w.weight.nbytes = out * row_bytes;
  return w;
}

// W [out, in] in a checkpoint format; block is the FP8 tile edge.
inline dsv4::Linear random_native_linear(dsv4::WeightFormat f, int64_t out, int64_t in, std::mt19937_64& rng,
                                         Keep& keep, int block = 128) {
  auto buffer = [&](size_t n) {
    keep.push_back(std::make_shared<std::vector<uint8_t>>(n));
    return keep.back()->data();
  };
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> byte(0, 255);
  dsv4::Linear w;
  w.format = f, w.out = out, w.in = in, w.block = block;
  w.weight.name = "test.weight", w.weight.file = "<random>";
  w.weight.shape = {out, in};
  switch (f) {
    case dsv4::WeightFormat::kF32: {
      float* p = reinterpret_cast<float*>(buffer(size_t(out * in) * 4));
      for (int64_t i = 0; i < out * in; ++i) p[i] = nd(rng) * 0.05f;
      w.weight.dtype = DType::kF32, w.weight.data = reinterpret_cast<uint8_t*>(p), w.weight.nbytes = out * in * 4;
      break;
    }
    case dsv4::WeightFormat::kBF16: {
      uint16_t* p = reinterpret_cast<uint16_t*>(buffer(size_t(out * in) * 2));
      for (int64_t i = 0; i < out * in; ++i) p[i] = f32_to_bf16(nd(rng) * 0.05f);
      w.weight.dtype = DType::kBF16, w.weight.data = reinterpret_cast<uint8_t*>(p), w.weight.nbytes = out * in * 2;
      break;
    }
    case dsv4::WeightFormat::kFP8Block: {
      uint8_t* p = buffer(size_t(out * in));
      for (int64_t i = 0; i < out * in; ++i) p[i] = f32_to_e4m3(nd(rng) * 100.0f);
      const int64_t so = (out + block - 1) / block, si = (in + block - 1) / block;
      uint8_t* s = buffer(size_t(so * si));
      std::uniform_int_distribution<int> sd(112, 118);  // 2^-15 .. 2^-9
      for (int64_t i = 0; i < so * si; ++i) s[i] = uint8_t(sd(rng));
      w.weight.dtype = DType::kF8E4M3, w.weight.data = p, w.weight.nbytes = out * in;
      w.scale.name = "test.scale", w.scale.dtype = DType::kF8E8M0, w.scale.shape = {so, si};
      w.scale.data = s, w.scale.nbytes = so * si;
      break;
    }
    case dsv4::WeightFormat::kMXFP4: {
      uint8_t* p = buffer(size_t(out * in / 2));
      for (int64_t i = 0; i < out * in / 2; ++i) p[i] = uint8_t(byte(rng));
      uint8_t* s = buffer(size_t(out * in / 32));
      std::uniform_int_distribution<int> sd(120, 124);
      for (int64_t i = 0; i < out * in / 32; ++i) s[i] = uint8_t(sd(rng));
      w.weight.dtype = DType::kI8, w.weight.data = p, w.weight.nbytes = out * in / 2;
      w.scale.name = "test.scale", w.scale.dtype = DType::kF8E8M0, w.scale.shape = {out, in / 32};
      w.scale.data = s, w.scale.nbytes = out * in / 32;
      break;
    }
    default: throw std::runtime_error("random_native_linear: not a checkpoint format");
  }
  return w;
}

}  // namespace aff::cuda::testing
