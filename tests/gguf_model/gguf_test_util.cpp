#include "gguf_test_util.h"

#include <cstring>
#include <random>

#include "format/gguf_reader.h"
#include "format/gguf_writer.h"

namespace aff::test {

namespace fs = std::filesystem;

TempDir::TempDir(const std::string& tag) {
  std::mt19937_64 rng(std::random_device{}());
  path_ = fs::temp_directory_path() / ("aff_gguf_model_" + tag + "_" + std::to_string(rng()));
  fs::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

Status rewrite_gguf(const fs::path& src, const fs::path& dst, const RewriteOptions& o) {
  AFF_ASSIGN_OR_RETURN(format::GgufFile f, format::GgufFile::open(src.string()));
  format::GgufWriter w(dst.string(), f.alignment());
  for (const auto& [k, v] : f.metadata()) {
    if (k == format::kGgufAlignmentKey) continue;
    bool drop = false;
    for (const auto& d : o.drop_keys) drop = drop || d == k;
    if (drop) continue;
    auto it = o.set_keys.find(k);
    AFF_RETURN_IF_ERROR(w.set(k, it != o.set_keys.end() ? it->second : v));
  }
  for (const auto& [k, v] : o.set_keys) {
    if (!f.find(k)) AFF_RETURN_IF_ERROR(w.set(k, v));
  }
  std::vector<const format::GgufTensorInfo*> kept;
  for (const auto& t : f.tensors()) {
    bool drop = !o.drop_prefix.empty() && t.name.rfind(o.drop_prefix, 0) == 0;
    for (const auto& d : o.drop_tensors) drop = drop || d == t.name;
    if (drop) continue;
    auto ne = t.ne;
    auto type = t.type;
    if (auto r = o.reshape.find(t.name); r != o.reshape.end()) ne = r->second;
    if (auto r = o.retype.find(t.name); r != o.retype.end()) type = r->second;
    AFF_RETURN_IF_ERROR(w.add_tensor(t.name, type, ne));
    kept.push_back(&t);
  }
  AFF_RETURN_IF_ERROR(w.write_header());
  for (size_t i = 0; i < kept.size(); ++i) {
    const auto data = f.tensor_data(*kept[i]);
    std::vector<uint8_t> bytes(w.tensors()[i].nbytes, 0);
    std::memcpy(bytes.data(), data.data(), std::min<size_t>(bytes.size(), data.size()));
    if (kept[i]->name == o.poison_tid2eid) {
      const int32_t bad = 1 << 20;
      std::memcpy(bytes.data() + 4 * (bytes.size() / 8), &bad, 4);
    }
    AFF_RETURN_IF_ERROR(w.append(bytes));
  }
  return w.finish();
}

}  // namespace aff::test
