// GGUF v2/v3 reader over a read-only mmap. Parsing validates everything a hostile file
// could lie about — every count, string length, array length, tensor shape, type, offset
// and size — before allocating or indexing, and reports the first problem as a Status
// naming the file and the key or tensor. Tensor data stays in the mapping: tensor_data()
// returns a span into it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "affinity/status.h"
#include "format/gguf_value.h"
#include "quant/type_traits.h"

namespace aff::format {

class MappedFile;

inline constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as little-endian u32
inline constexpr uint32_t kGgufVersion = 3;
inline constexpr uint32_t kGgufDefaultAlignment = 32;
inline constexpr std::string_view kGgufAlignmentKey = "general.alignment";
inline constexpr size_t kGgufMaxTensorName = 64;  // ggml's GGML_MAX_NAME, NUL included
inline constexpr size_t kGgufMaxKeyLength = 65535;
inline constexpr int kGgufMaxDims = 4;

struct GgufTensorInfo {
  std::string name;
  quant::GgmlType type = quant::GgmlType::kF32;
  std::vector<int64_t> ne;  // ggml order: ne[0] is the contiguous dimension (row length)
  uint64_t offset = 0;      // from the start of the data section; a multiple of the alignment
  uint64_t nbytes = 0;      // rows * row bytes

  int64_t n_elements() const;
  int64_t n_rows() const;  // product of ne[1..]
};

class GgufFile {
 public:
  // Maps and parses `path`.
  static Result<GgufFile> open(const std::string& path);
  // Parses a GGUF image already in memory (fuzzing, tests). `bytes` must outlive the
  // result; `label` names it in error messages.
  static Result<GgufFile> parse(std::span<const uint8_t> bytes, std::string label);

  const std::string& label() const { return label_; }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // absolute file offset of tensor data
  uint64_t file_size() const { return bytes_.size(); }

  // Metadata in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kv_; }
  const GgufValue* find(std::string_view key) const;
  // Typed lookups: not_found if absent, corrupt (naming the key and both types) if the
  // stored type cannot represent the request.
  Result<uint64_t> get_uint(std::string_view key) const;
  Result<int64_t> get_int(std::string_view key) const;
  Result<double> get_float(std::string_view key) const;
  Result<bool> get_bool(std::string_view key) const;
  Result<std::string> get_string(std::string_view key) const;
  // Architecture name from general.architecture (e.g. "deepseek4").
  Result<std::string> architecture() const { return get_string("general.architecture"); }

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;
  // The tensor's bytes inside the mapping (validated at parse time).
  std::span<const uint8_t> tensor_data(const GgufTensorInfo& t) const {
    return bytes_.subspan(data_offset_ + t.offset, t.nbytes);
  }

 private:
  GgufFile() = default;
  Status parse_all();

  std::shared_ptr<MappedFile> file_;  // null when parsing borrowed memory
  std::span<const uint8_t> bytes_;
  std::string label_;
  uint32_t version_ = 0;
  uint32_t alignment_ = kGgufDefaultAlignment;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::vector<GgufTensorInfo> tensors_;
  std::unordered_map<std::string, size_t> kv_index_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

}  // namespace aff::format
