// NumPy .npy files (format 1.0 write; 1.0/2.0/3.0 read), little-endian float32,
// C order only: the CLI's --logits-out and test fixtures. Spec: numpy's
// "format.rst" (magic \x93NUMPY, version, header length, a Python dict literal
// padded so the data starts on a 64-byte boundary).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "affinity/status.h"

namespace aff::format {

struct NpyArray {
  std::vector<int64_t> shape;  // C order, outermost first; {} = a scalar
  std::vector<float> data;     // numel(shape) values, row-major
};

// data: numel(shape) floats, row-major. Writes to `path` (overwrites).
Status write_npy_f32(const std::string& path, std::span<const int64_t> shape, std::span<const float> data);

// Accepts only descr '<f4' and fortran_order False; anything else, or a header
// that contradicts the file size, is an error naming the file.
Result<NpyArray> read_npy_f32(const std::string& path);

}  // namespace aff::format
