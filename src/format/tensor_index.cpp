#include "format/tensor_index.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace aff::format {

namespace fs = std::filesystem;
using nlohmann::json;

const TensorView* TensorIndex::find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

Result<TensorView> TensorIndex::get(std::string_view name) const {
  if (const TensorView* v = find(name)) return *v;
  return not_found(fmt::format("{}: tensor '{}' is missing", source_, name));
}

std::vector<std::shared_ptr<void>> TensorIndex::keep_alive() const {
  std::vector<std::shared_ptr<void>> out;
  for (const auto& s : shards_) out.push_back(std::const_pointer_cast<SafetensorsFile>(s));
  return out;
}

Result<TensorIndex> TensorIndex::open_file(const std::string& path) {
  AFF_ASSIGN_OR_RETURN(auto shard, open_safetensors(path));
  TensorIndex idx;
  idx.source_ = path;
  for (const TensorView& v : shard->tensors) idx.tensors_.emplace(v.name, v);
  idx.shards_.push_back(std::move(shard));
  return idx;
}

namespace {

Result<std::string> read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error(path + ": cannot read");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return io_error(path + ": read error");
  return ss.str();
}

// Shard names come from a file we do not trust: keep them inside the directory.
bool is_plain_file_name(const std::string& s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos &&
         s.find('\\') == std::string::npos && s.find('\0') == std::string::npos;
}

}  // namespace

Result<TensorIndex> TensorIndex::open_dir(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return not_found(fmt::format("{}: not a directory", dir));
  const std::string index_path = (fs::path(dir) / kSafetensorsIndexName).string();
  if (!fs::exists(index_path, ec)) {
    const std::string single = (fs::path(dir) / kSafetensorsSingleName).string();
    if (!fs::exists(single, ec)) {
      return not_found(fmt::format("{}: neither {} nor {} exists", dir, kSafetensorsIndexName,
                                   kSafetensorsSingleName));
    }
    return open_file(single);
  }

  AFF_ASSIGN_OR_RETURN(std::string text, read_text_file(index_path));
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    return corrupt(fmt::format("{}: not valid JSON: {}", index_path, e.what()));
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
    return corrupt(fmt::format("{}: field 'weight_map' is missing or not an object", index_path));
  }

  TensorIndex idx;
  idx.source_ = index_path;
  std::map<std::string, std::shared_ptr<const SafetensorsFile>> opened;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    const std::string& name = it.key();
    if (!it.value().is_string()) {
      return corrupt(fmt::format("{}: weight_map entry for tensor '{}' is not a string", index_path, name));
    }
    const std::string shard_name = it.value().get<std::string>();
    if (!is_plain_file_name(shard_name)) {
      return corrupt(fmt::format("{}: tensor '{}' names shard '{}', which is not a plain file name in the "
                                 "checkpoint directory", index_path, name, shard_name));
    }
    auto sit = opened.find(shard_name);
    if (sit == opened.end()) {
      const std::string shard_path = (fs::path(dir) / shard_name).string();
      auto shard = open_safetensors(shard_path);
      if (!shard.is_ok()) {
        return shard.status().with_context(
            fmt::format("{}: shard '{}' (listed for tensor '{}')", index_path, shard_name, name));
      }
      sit = opened.emplace(shard_name, std::move(shard).value()).first;
      idx.shards_.push_back(sit->second);
    }
    const TensorView* v = sit->second->find(name);
    if (v == nullptr) {
      return not_found(fmt::format("{}: tensor '{}' is mapped to shard '{}', which does not contain it",
                                   index_path, name, sit->second->path));
    }
    idx.tensors_.emplace(name, *v);
  }
  return idx;
}

}  // namespace aff::format
