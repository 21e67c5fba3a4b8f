// aff-info FILE|DIR [--gpu-mib N] [--ctx N]: what a model holds and how it
// would be placed. Exit status: 0 no problem found, 1 problems (listed) or the
// model could not be read, 2 usage error.
#include <cstdio>
#include <cstdlib>
#include <string>

#include <fmt/format.h>

#include "model/dsv4/model_summary.h"

namespace {

constexpr const char* kUsage =
    "usage: aff-info FILE.gguf|CHECKPOINT_DIR [--gpu-mib N] [--ctx N]\n"
    "  --gpu-mib N  show the VRAM/RAM split for N MiB of GPU memory: dense weights and the KV state\n"
    "               for --ctx positions first, then whole routed experts round-robin over layers;\n"
    "               the remaining experts stay in host RAM\n"
    "  --ctx N      positions the KV state is sized for (default 65536)\n"
    "exit status: 0 no problem found, 1 problems found or unreadable model, 2 usage error\n";

int usage_error(const std::string& msg) {
  std::fprintf(stderr, "aff-info: error: %s\n%s", msg.c_str(), kUsage);
  return 2;
}

bool parse_positive(const char* s, long long* out) {
  char* end = nullptr;
  const long long v = std::strtoll(s, &end, 10);
  if (end == s || *end != '\0' || v <= 0) return false;
  *out = v;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string path;
  long long gpu_mib = 0, ctx = 65536;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (a == "--gpu-mib" || a == "--ctx") {
      if (i + 1 >= argc) return usage_error(a + " needs a value");
      long long v;
      if (!parse_positive(argv[++i], &v)) return usage_error(fmt::format("{} wants a positive integer, got '{}'", a, argv[i]));
      (a == "--ctx" ? ctx : gpu_mib) = v;
      continue;
    }
    if (!a.empty() && a[0] == '-') return usage_error("unknown option '" + a + "'");
    if (!path.empty()) return usage_error("more than one model given");
    path = a;
  }
  if (path.empty()) return usage_error("no model given");

  auto s = aff::dsv4::summarize_model(path);
  if (!s.is_ok()) {
    std::fprintf(stderr, "aff-info: %s\n", s.status().message().c_str());
    return 1;
  }
  std::optional<uint64_t> gpu;
  if (gpu_mib > 0) gpu = uint64_t(gpu_mib) << 20;
  std::fputs(aff::dsv4::format_summary(*s, gpu, ctx).c_str(), stdout);
  bool problems = !s->problems.empty();
  if (gpu && !aff::dsv4::plan_placement(*s, *gpu, ctx).dense_fits) problems = true;
  return problems ? 1 : 0;
}
