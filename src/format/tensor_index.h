// Name -> tensor view over a whole HF checkpoint directory: either
// model.safetensors.index.json plus the shards its weight_map names, or a lone
// model.safetensors. Every listed tensor is checked to be present in its shard
// when the index is opened, so later lookups cannot fail on a bad shard.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "affinity/status.h"
#include "core/tensor.h"
#include "format/safetensors.h"

namespace aff::format {

inline constexpr const char* kSafetensorsIndexName = "model.safetensors.index.json";
inline constexpr const char* kSafetensorsSingleName = "model.safetensors";

class TensorIndex {
 public:
  // Opens `dir`: the index file if present, else model.safetensors. Errors
  // name the index and, for shard problems, the shard and the tensor.
  static Result<TensorIndex> open_dir(const std::string& dir);
  // Opens one safetensors file as a (one-shard) index.
  static Result<TensorIndex> open_file(const std::string& path);

  // nullptr when absent.
  const TensorView* find(std::string_view name) const;
  // The view, or not_found naming the tensor and the index file.
  Result<TensorView> get(std::string_view name) const;

  // What errors about missing tensors cite: the index json or the lone file.
  const std::string& source() const { return source_; }
  const std::map<std::string, TensorView, std::less<>>& tensors() const { return tensors_; }
  const std::vector<std::shared_ptr<const SafetensorsFile>>& shards() const { return shards_; }
  // The mappings as type-erased owners, for LoadedModel::keep_alive.
  std::vector<std::shared_ptr<void>> keep_alive() const;

 private:
  std::string source_;
  std::map<std::string, TensorView, std::less<>> tensors_;
  std::vector<std::shared_ptr<const SafetensorsFile>> shards_;
};

}  // namespace aff::format
