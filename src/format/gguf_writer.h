// GGUF v3 writer that streams tensor data: metadata and tensor infos are declared first,
// the header is written, then tensor bytes are appended in declaration order (in chunks of
// any size, e.g. one expert at a time), so a model is never held in memory. Output goes to
// "<path>.tmp" and is renamed over <path> only by a successful finish(); a writer destroyed
// before that removes its temporary file.
#pragma once

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "affinity/status.h"
#include "format/gguf_reader.h"
#include "format/gguf_value.h"
#include "quant/type_traits.h"

namespace aff::format {

class GgufWriter {
 public:
  explicit GgufWriter(std::string path, uint32_t alignment = kGgufDefaultAlignment);
  ~GgufWriter();
  GgufWriter(const GgufWriter&) = delete;
  GgufWriter& operator=(const GgufWriter&) = delete;

  // Declaration phase (before write_header). Keys and tensor names must be unique;
  // general.alignment is written by the writer itself.
  Status set(std::string key, GgufValue value);
  // ne in ggml order (ne[0] = row length, a multiple of the type's block size), 1..4 dims.
  Status add_tensor(std::string name, quant::GgmlType type, std::vector<int64_t> ne);

  // Opens the temporary file and writes header, metadata, tensor infos and padding.
  Status write_header();
  // Appends bytes of the tensors' data, in declaration order; a chunk may span tensors.
  Status append(std::span<const uint8_t> bytes);
  // Convenience: the whole data of the next tensor, which must be `name`.
  Status write_tensor(std::string_view name, std::span<const uint8_t> bytes);
  // Checks every declared byte was written, flushes, syncs and renames into place.
  Status finish();

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  uint64_t data_bytes_written() const { return written_; }

 private:
  Status write_raw(const void* p, size_t n);
  Status write_value(const GgufValue& v);
  Status pad_to_alignment(uint64_t pos);
  void abandon();

  std::string path_, tmp_path_;
  uint32_t alignment_;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::unordered_set<std::string> keys_, names_;
  std::vector<GgufTensorInfo> tensors_;
  uint64_t data_size_ = 0;     // sum of aligned tensor sizes
  std::FILE* out_ = nullptr;
  std::vector<char> buffer_;
  uint64_t file_pos_ = 0;
  size_t cur_tensor_ = 0;      // tensor whose bytes append() is writing
  uint64_t cur_written_ = 0;   // bytes of it written so far
  uint64_t written_ = 0;       // tensor bytes written in total
  bool finished_ = false;
};

}  // namespace aff::format
