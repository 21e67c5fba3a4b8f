// Reading safetensors files: an 8-byte little-endian header length N, N bytes
// of JSON ({name: {dtype, shape, data_offsets: [begin, end)}, "__metadata__":
// {str: str}}), then the data section that the offsets index. Every number in
// the header is checked against the file before a view is handed out, so a
// hostile or truncated file yields a Status naming the file and tensor, never
// an out-of-bounds read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "affinity/status.h"
#include "core/tensor.h"
#include "format/mapped_file.h"

namespace aff::format {

// Largest header we accept. The safetensors reference library uses the same
// bound; real V4 shards have headers of ~120 KB.
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100ull << 20;

struct SafetensorsFile {
  std::string path;                            // as opened; used in every message
  std::shared_ptr<const MappedFile> mapping;   // backs every view (null for parse_safetensors)
  std::map<std::string, std::string> metadata; // "__metadata__" (e.g. format=pt)
  std::vector<TensorView> tensors;             // in data-offset order
  uint64_t data_offset = 0;                    // 8 + header length

  // nullptr when absent.
  const TensorView* find(std::string_view name) const;

 private:
  friend Result<SafetensorsFile> parse_safetensors(const uint8_t*, size_t, const std::string&);
  std::unordered_map<std::string, size_t> by_name_;
};

// Parses an in-memory safetensors image of `size` bytes; `file` names it in
// errors. Views point into `bytes`, which the caller keeps alive.
Result<SafetensorsFile> parse_safetensors(const uint8_t* bytes, size_t size, const std::string& file);

// Maps and parses one file. The result owns the mapping.
Result<std::shared_ptr<const SafetensorsFile>> open_safetensors(const std::string& path);

}  // namespace aff::format
