// Helpers for the GGUF model tests: a scratch directory and a GGUF rewriter
// that copies a file with one deliberate defect (for loader error tests).
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "affinity/status.h"
#include "format/gguf_value.h"
#include "quant/type_traits.h"

namespace aff::test {

// A fresh directory under the system temp dir, removed on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& tag);
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

struct RewriteOptions {
  std::vector<std::string> drop_keys;
  std::map<std::string, format::GgufValue> set_keys;          // replaced or added
  std::vector<std::string> drop_tensors;
  std::string drop_prefix;                                    // drop tensors whose name starts so
  std::map<std::string, std::vector<int64_t>> reshape;        // new ne; data truncated / zero-padded
  std::map<std::string, quant::GgmlType> retype;              // new type; data truncated / zero-padded
  std::string poison_tid2eid;                                 // I32 tensor: one id set out of range
};

// Copies src to dst applying `o` (keys keep file order; tensors keep order).
Status rewrite_gguf(const std::filesystem::path& src, const std::filesystem::path& dst, const RewriteOptions& o);

}  // namespace aff::test
