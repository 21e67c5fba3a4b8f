// Writing safetensors files (tests, the synthetic checkpoint generator, and
// later converters). Tensors are buffered and written in one pass; the data
// section is ordered by element size (largest first) so every tensor starts at
// an offset aligned to its own element size.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "affinity/status.h"
#include "core/dtype.h"

namespace aff::format {

class SafetensorsWriter {
 public:
  // `bytes` must hold exactly numel(shape) * dtype_size(dtype) bytes (checked
  // at write time). Adding a name twice replaces the earlier tensor.
  void add(const std::string& name, DType dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes);
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }

  size_t num_tensors() const { return tensors_.size(); }
  uint64_t data_bytes() const;

  // Writes the file (header padded with spaces to a multiple of 8).
  Status write(const std::string& path) const;
  // The complete file image, for tests that then corrupt it.
  Result<std::vector<uint8_t>> serialize() const;

 private:
  struct Entry {
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::map<std::string, Entry> tensors_;
  std::map<std::string, std::string> metadata_{{"format", "pt"}};
};

}  // namespace aff::format
