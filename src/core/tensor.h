// A read-only view of a stored tensor: bytes that live in an mmap'd file (or a
// buffer owned elsewhere), with the dtype and logical shape from its header.
// Views never own memory; whoever produced them keeps the mapping alive.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace aff {

struct TensorView {
  std::string name;            // name as stored, e.g. "layers.3.attn.wq_a.weight"
  std::string file;            // file it came from (for error messages)
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // row-major, outermost first (safetensors order)
  const uint8_t* data = nullptr;
  uint64_t nbytes = 0;

  bool valid() const { return data != nullptr; }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  int64_t dim(int i) const { return shape.at(size_t(i)); }
  template <typename T>
  const T* as() const { return reinterpret_cast<const T*>(data); }
};

std::string shape_string(const std::vector<int64_t>& shape);  // "[1024, 4096]"

}  // namespace aff
