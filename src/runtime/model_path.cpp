#include "runtime/model_path.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include <fmt/format.h>

namespace aff::runtime {

namespace fs = std::filesystem;

namespace {

bool is_model_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p / "config.json", ec);
}

}  // namespace

std::vector<std::string> default_model_roots() {
  std::vector<std::string> roots;
#ifdef AFFINITY_SOURCE_DIR
  roots.push_back((fs::path(AFFINITY_SOURCE_DIR) / "models").string());
#endif
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const std::string next_to_binary = (exe.parent_path() / ".." / ".." / "models").lexically_normal().string();
    if (std::find(roots.begin(), roots.end(), next_to_binary) == roots.end()) roots.push_back(next_to_binary);
  }
  return roots;
}

Result<std::string> find_default_model(const std::vector<std::string>& roots) {
  for (const std::string& root : roots) {
    const fs::path preferred = fs::path(root) / kDefaultModelName;
    if (is_model_dir(preferred)) return preferred.string();
    std::error_code ec;
    std::vector<fs::path> dirs;
    for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
      if (it->is_directory(ec) && is_model_dir(it->path())) dirs.push_back(it->path());
    }
    if (!dirs.empty()) return std::min_element(dirs.begin(), dirs.end())->string();
  }
  std::string searched;
  for (const std::string& r : roots) searched += (searched.empty() ? "" : ", ") + r;
  return not_found(fmt::format("no model given (-m DIR) and no embedded default model (a directory with "
                               "config.json) under {}",
                               searched.empty() ? "(no models/ roots)" : searched));
}

}  // namespace aff::runtime
