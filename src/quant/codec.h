// Row-level dequantisation and reference quantisation for ggml block formats.
// A "row" is n consecutive elements (n a multiple of the type's block size) stored as
// n / block_elems blocks; this is how GGUF stores the contiguous dimension ne0.
// These are the scalar reference codecs: bit-compatible with ggml on decode, and the
// oracle that fast CPU/CUDA kernels are tested against.
#pragma once

#include <cstdint>
#include <span>

#include "affinity/status.h"
#include "quant/type_traits.h"

namespace aff::quant {

// src: the row's blocks, exactly ggml_row_bytes(type, dst.size()) bytes.
// dst: [n] f32 outputs.
Status dequantize_row(GgmlType type, std::span<const uint8_t> src, std::span<float> dst);

// src: [n] f32 inputs. dst: exactly ggml_row_bytes(type, n) bytes.
// importance: empty, or [n] non-negative per-column weights (an imatrix row: mean of the
// squared activations each column meets). The quantiser minimises the importance-weighted
// squared error; without one, the plain squared error.
Status quantize_row(GgmlType type, std::span<const float> src, std::span<uint8_t> dst,
                    std::span<const float> importance = {});

}  // namespace aff::quant
