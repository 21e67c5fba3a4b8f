// A read-only memory mapping of a whole file. Tensor views point into it, so it
// is handed around as a shared_ptr and kept alive by whoever holds the views.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "affinity/status.h"

namespace aff::format {

class MappedFile {
 public:
  // Maps `path` read-only. Errors (missing file, directory, permission, mmap
  // failure) name the path and the OS reason. An empty file maps to size 0.
  static Result<std::shared_ptr<MappedFile>> open(const std::string& path);

  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}

  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace aff::format
