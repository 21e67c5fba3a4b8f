#include "quant/type_traits.h"

#include <array>
#include <limits>

#include "core/check.h"

namespace aff::quant {
namespace {

using T = GgmlType;

// Sizes are ggml's (ggml-common.h block structs); QK_K = 256.
constexpr std::array kTraits = {
    GgmlTypeTraits{T::kF32, "F32", 1, 4, false, true, true},
    GgmlTypeTraits{T::kF16, "F16", 1, 2, false, true, true},
    GgmlTypeTraits{T::kQ4_0, "Q4_0", 32, 18, true, false, false},
    GgmlTypeTraits{T::kQ4_1, "Q4_1", 32, 20, true, false, false},
    GgmlTypeTraits{T::kQ5_0, "Q5_0", 32, 22, true, false, false},
    GgmlTypeTraits{T::kQ5_1, "Q5_1", 32, 24, true, false, false},
    GgmlTypeTraits{T::kQ8_0, "Q8_0", 32, 34, true, true, true},
    GgmlTypeTraits{T::kQ8_1, "Q8_1", 32, 36, true, false, false},
    GgmlTypeTraits{T::kQ2_K, "Q2_K", 256, 84, true, true, true},
    GgmlTypeTraits{T::kQ3_K, "Q3_K", 256, 110, true, true, true},
    GgmlTypeTraits{T::kQ4_K, "Q4_K", 256, 144, true, true, true},
    GgmlTypeTraits{T::kQ5_K, "Q5_K", 256, 176, true, true, false},
    GgmlTypeTraits{T::kQ6_K, "Q6_K", 256, 210, true, true, false},
    GgmlTypeTraits{T::kQ8_K, "Q8_K", 256, 292, true, false, false},
    GgmlTypeTraits{T::kIQ2_XXS, "IQ2_XXS", 256, 66, true, true, true},
    GgmlTypeTraits{T::kIQ2_XS, "IQ2_XS", 256, 74, true, true, true},
    GgmlTypeTraits{T::kIQ3_XXS, "IQ3_XXS", 256, 98, true, true, true},
    GgmlTypeTraits{T::kIQ1_S, "IQ1_S", 256, 50, true, true, true},
    GgmlTypeTraits{T::kIQ4_NL, "IQ4_NL", 32, 18, true, true, true},
    GgmlTypeTraits{T::kIQ3_S, "IQ3_S", 256, 110, true, false, false},
    GgmlTypeTraits{T::kIQ2_S, "IQ2_S", 256, 82, true, false, false},
    GgmlTypeTraits{T::kIQ4_XS, "IQ4_XS", 256, 136, true, true, true},
    GgmlTypeTraits{T::kI8, "I8", 1, 1, false, false, false},
    GgmlTypeTraits{T::kI16, "I16", 1, 2, false, false, false},
    GgmlTypeTraits{T::kI32, "I32", 1, 4, false, false, false},
    GgmlTypeTraits{T::kI64, "I64", 1, 8, false, false, false},
    GgmlTypeTraits{T::kF64, "F64", 1, 8, false, false, false},
    GgmlTypeTraits{T::kIQ1_M, "IQ1_M", 256, 56, true, true, true},
    GgmlTypeTraits{T::kBF16, "BF16", 1, 2, false, true, true},
    GgmlTypeTraits{T::kTQ1_0, "TQ1_0", 256, 54, true, false, false},
    GgmlTypeTraits{T::kTQ2_0, "TQ2_0", 256, 66, true, false, false},
    GgmlTypeTraits{T::kMXFP4, "MXFP4", 32, 17, true, true, true},
};

}  // namespace

std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t id) {
  for (const auto& t : kTraits) {
    if (static_cast<uint32_t>(t.type) == id) return t;
  }
  return std::nullopt;
}

const GgmlTypeTraits& ggml_traits(GgmlType type) {
  for (const auto& t : kTraits) {
    if (t.type == type) return t;
  }
  AFF_CHECK(false && "GgmlType enumerator missing from kTraits");
  return kTraits[0];
}

std::string_view ggml_type_name(GgmlType t) { return ggml_traits(t).name; }

std::optional<GgmlType> ggml_type_from_name(std::string_view name) {
  for (const auto& t : kTraits) {
    if (t.name == name) return t.type;
  }
  return std::nullopt;
}

std::optional<int64_t> ggml_row_bytes(GgmlType type, int64_t n) {
  const auto& t = ggml_traits(type);
  if (n < 0 || n % t.block_elems != 0) return std::nullopt;
  const int64_t blocks = n / t.block_elems;
  if (blocks > std::numeric_limits<int64_t>::max() / t.block_bytes) return std::nullopt;
  return blocks * t.block_bytes;
}

double ggml_bits_per_weight(GgmlType type) {
  const auto& t = ggml_traits(type);
  return double(t.block_bytes) * 8.0 / double(t.block_elems);
}

}  // namespace aff::quant
