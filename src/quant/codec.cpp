// Dispatch from a ggml type to its row codec, with the size checks the per-format
// functions leave to their caller.
#include "quant/codec.h"

#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "core/dtype.h"
#include "quant/formats.h"
#include "quant/quantizer/iq_quantize.h"

namespace aff::quant {
namespace {

Status check_sizes(GgmlType type, size_t n, size_t bytes, const char* what) {
  const auto want = ggml_row_bytes(type, int64_t(n));
  if (!want) {
    return invalid_argument(fmt::format("{} {}: row of {} elements is not a multiple of the block size {}",
                                        what, ggml_type_name(type), n, ggml_traits(type).block_elems));
  }
  if (size_t(*want) != bytes) {
    return invalid_argument(fmt::format("{} {}: row of {} elements needs {} bytes, got {}", what,
                                        ggml_type_name(type), n, *want, bytes));
  }
  return Status::ok();
}

template <typename Block>
const Block* blocks(std::span<const uint8_t> s) {
  return reinterpret_cast<const Block*>(s.data());
}
template <typename Block>
Block* blocks(std::span<uint8_t> s) {
  return reinterpret_cast<Block*>(s.data());
}

}  // namespace

Status dequantize_row(GgmlType type, std::span<const uint8_t> src, std::span<float> dst) {
  AFF_RETURN_IF_ERROR(check_sizes(type, dst.size(), src.size(), "dequantize"));
  float* y = dst.data();
  const int64_t n = int64_t(dst.size());
  switch (type) {
    case GgmlType::kF32: std::memcpy(y, src.data(), src.size()); return Status::ok();
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src.data() + 2 * i, 2);
        y[i] = f16_to_f32(h);
      }
      return Status::ok();
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src.data() + 2 * i, 2);
        y[i] = bf16_to_f32(h);
      }
      return Status::ok();
    case GgmlType::kQ8_0: dequantize_row_q8_0(blocks<BlockQ8_0>(src), y, n); return Status::ok();
    case GgmlType::kMXFP4: dequantize_row_mxfp4(blocks<BlockMxfp4>(src), y, n); return Status::ok();
    case GgmlType::kQ2_K: dequantize_row_q2_k(blocks<BlockQ2K>(src), y, n); return Status::ok();
    case GgmlType::kQ3_K: dequantize_row_q3_k(blocks<BlockQ3K>(src), y, n); return Status::ok();
    case GgmlType::kQ4_K: dequantize_row_q4_k(blocks<BlockQ4K>(src), y, n); return Status::ok();
    case GgmlType::kQ5_K: dequantize_row_q5_k(blocks<BlockQ5K>(src), y, n); return Status::ok();
    case GgmlType::kQ6_K: dequantize_row_q6_k(blocks<BlockQ6K>(src), y, n); return Status::ok();
    case GgmlType::kIQ4_NL: dequantize_row_iq4_nl(blocks<BlockIq4Nl>(src), y, n); return Status::ok();
    case GgmlType::kIQ4_XS: dequantize_row_iq4_xs(blocks<BlockIq4Xs>(src), y, n); return Status::ok();
    case GgmlType::kIQ2_XXS: dequantize_row_iq2_xxs(blocks<BlockIq2Xxs>(src), y, n); return Status::ok();
    case GgmlType::kIQ2_XS: dequantize_row_iq2_xs(blocks<BlockIq2Xs>(src), y, n); return Status::ok();
    case GgmlType::kIQ3_XXS: dequantize_row_iq3_xxs(blocks<BlockIq3Xxs>(src), y, n); return Status::ok();
    case GgmlType::kIQ1_S: dequantize_row_iq1_s(blocks<BlockIq1S>(src), y, n); return Status::ok();
    case GgmlType::kIQ1_M: dequantize_row_iq1_m(blocks<BlockIq1M>(src), y, n); return Status::ok();
    default: break;
  }
  return unsupported(fmt::format("dequantize: no decoder for ggml type {}", ggml_type_name(type)));
}

Status quantize_row(GgmlType type, std::span<const float> src, std::span<uint8_t> dst,
                    std::span<const float> importance) {
  AFF_RETURN_IF_ERROR(check_sizes(type, src.size(), dst.size(), "quantize"));
  if (!importance.empty() && importance.size() != src.size()) {
    return invalid_argument(fmt::format("quantize {}: importance has {} entries for a row of {}",
                                        ggml_type_name(type), importance.size(), src.size()));
  }
  for (float w : importance) {
    if (!(w >= 0.0f) || !std::isfinite(w)) {
      return invalid_argument(fmt::format("quantize {}: importance values must be finite and >= 0",
                                          ggml_type_name(type)));
    }
  }
  const float* x = src.data();
  const float* imp = importance.empty() ? nullptr : importance.data();
  const int64_t n = int64_t(src.size());
  switch (type) {
    case GgmlType::kF32: std::memcpy(dst.data(), x, dst.size()); return Status::ok();
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_f16(x[i]);
        std::memcpy(dst.data() + 2 * i, &h, 2);
      }
      return Status::ok();
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_bf16(x[i]);
        std::memcpy(dst.data() + 2 * i, &h, 2);
      }
      return Status::ok();
    case GgmlType::kQ8_0: quantize_row_q8_0(x, blocks<BlockQ8_0>(dst), n, imp); return Status::ok();
    case GgmlType::kMXFP4: quantize_row_mxfp4(x, blocks<BlockMxfp4>(dst), n, imp); return Status::ok();
    case GgmlType::kQ2_K: quantize_row_q2_k(x, blocks<BlockQ2K>(dst), n, imp); return Status::ok();
    case GgmlType::kQ3_K: quantize_row_q3_k(x, blocks<BlockQ3K>(dst), n, imp); return Status::ok();
    case GgmlType::kQ4_K: quantize_row_q4_k(x, blocks<BlockQ4K>(dst), n, imp); return Status::ok();
    case GgmlType::kIQ4_NL: quantize_row_iq4_nl(x, blocks<BlockIq4Nl>(dst), n, imp); return Status::ok();
    case GgmlType::kIQ4_XS: quantize_row_iq4_xs(x, blocks<BlockIq4Xs>(dst), n, imp); return Status::ok();
    case GgmlType::kIQ2_XXS: quantize_row_iq2_xxs(x, blocks<BlockIq2Xxs>(dst), n, imp); return Status::ok();
    case GgmlType::kIQ2_XS: quantize_row_iq2_xs(x, blocks<BlockIq2Xs>(dst), n, imp); return Status::ok();
    case GgmlType::kIQ3_XXS: quantize_row_iq3_xxs(x, blocks<BlockIq3Xxs>(dst), n, imp); return Status::ok();
    case GgmlType::kIQ1_S: quantize_row_iq1_s(x, blocks<BlockIq1S>(dst), n, imp); return Status::ok();
    case GgmlType::kIQ1_M: quantize_row_iq1_m(x, blocks<BlockIq1M>(dst), n, imp); return Status::ok();
    default: break;
  }
  return unsupported(fmt::format("quantize: no reference quantiser for ggml type {}", ggml_type_name(type)));
}

}  // namespace aff::quant
