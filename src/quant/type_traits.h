// ggml tensor element types (the `ggml_type` ids stored in GGUF tensor infos) and their
// block geometry. This is the one table that says how many bytes a row of a given type
// takes; the GGUF reader, writer and every quantised kernel size rows through it.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace aff::quant {

// Values are ggml's on-disk ids (include/ggml.h); gaps are ids ggml retired.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
};

struct GgmlTypeTraits {
  GgmlType type;
  std::string_view name;    // ggml spelling: "Q4_K", "IQ2_XXS", "F32"
  int64_t block_elems;      // elements per block (1 for plain scalar types)
  int64_t block_bytes;      // bytes per block
  bool quantized;           // block format with scales (not a plain scalar type)
  bool can_dequantize;      // affinity has a row dequantiser for it
  bool can_quantize;        // affinity has a reference quantiser for it
};

// Traits of a known id, or nullopt for an id ggml never defined or retired.
std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t id);
// Traits of a known type (every enumerator is known).
const GgmlTypeTraits& ggml_traits(GgmlType t);
std::string_view ggml_type_name(GgmlType t);
std::optional<GgmlType> ggml_type_from_name(std::string_view name);

// Bytes of one row of `n` elements, or nullopt if n is negative, not a multiple of the
// block size, or the byte count would overflow int64.
std::optional<int64_t> ggml_row_bytes(GgmlType t, int64_t n);

// Bits per weight (block_bytes * 8 / block_elems).
double ggml_bits_per_weight(GgmlType t);

}  // namespace aff::quant
