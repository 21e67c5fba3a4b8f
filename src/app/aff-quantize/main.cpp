// aff-quantize: HF DeepSeek-V4 checkpoint directory -> deepseek4 GGUF container.
//   aff-quantize --src DIR --out FILE.gguf [--recipe NAME | --type PATTERN=TYPE ...]
//                [--imatrix FILE] [--layers N] [--threads N]
// Exit status: 0 on success, 1 when quantisation failed (no output file is left), 2 on
// a usage error.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "quant/quantizer/quantize_model.h"

namespace {

using aff::quant::QuantizeOptions;
using aff::quant::QuantizeProgress;

struct Flag {
  std::string_view name, metavar, help;
};

// The one list of flags: parsing accepts exactly these, --help prints them.
constexpr Flag kFlags[] = {
    {"--src", "DIR", "HF checkpoint directory (config.json, safetensors, tokenizer.json)"},
    {"--out", "FILE", "output GGUF file (written as FILE.tmp, renamed when complete)"},
    {"--recipe", "NAME", "q2 (experts IQ2_XXS gate/up + Q2_K down, ~2.25 bpw), q4 (Q4_K), q8 (Q8_0), "
                         "mxfp4 (lossless for FP4 experts); default q4"},
    {"--type", "PATTERN=TYPE", "override the type of tensors whose GGUF name matches the glob; repeatable, "
                               "last match wins (e.g. 'blk.*.ffn_down_exps.weight=Q4_K')"},
    {"--imatrix", "FILE", "importance matrix, llama.cpp legacy .dat or GGUF imatrix"},
    {"--layers", "N", "write only the first N blocks (MTP kept); default all"},
    {"--threads", "N", "quantisation threads; output is identical for any N; default all cores"},
    {"--quiet", "", "no progress output"},
    {"--help", "", "this text"},
};

void print_help(std::FILE* f) {
  std::fprintf(f, "usage: aff-quantize --src DIR --out FILE.gguf [options]\n\n");
  for (const auto& fl : kFlags) {
    const std::string left = fmt::format("{} {}", fl.name, fl.metavar);
    std::fprintf(f, "  %-26s %s\n", left.c_str(), std::string(fl.help).c_str());
  }
}

int usage_error(const std::string& msg) {
  std::fprintf(stderr, "aff-quantize: %s\n\n", msg.c_str());
  print_help(stderr);
  return 2;
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024.0 && u < 4) b /= 1024.0, ++u;
  return fmt::format("{:.1f} {}", b, units[u]);
}

std::string human_seconds(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const int t = int(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02}m", t / 3600, (t / 60) % 60);
  if (t >= 60) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

// A bar redrawn in place on a terminal; plain lines at every 5% when piped.
class ProgressPrinter {
 public:
  explicit ProgressPrinter(bool tty) : tty_(tty) {}
  void operator()(const QuantizeProgress& p) {
    const double frac = p.bytes_total ? double(p.bytes_done) / double(p.bytes_total) : 1.0;
    const double eta = frac > 0 ? p.elapsed_s * (1.0 - frac) / frac : -1.0;
    if (tty_) {
      constexpr int kWidth = 30;
      const int fill = int(frac * kWidth);
      std::fprintf(stderr, "\r[%s%s] %5.1f%% %s/%s ETA %s  %-40.40s", std::string(size_t(fill), '#').c_str(),
                   std::string(size_t(kWidth - fill), '.').c_str(), 100 * frac, human_bytes(double(p.bytes_done)).c_str(),
                   human_bytes(double(p.bytes_total)).c_str(), human_seconds(eta).c_str(), p.tensor.c_str());
      std::fflush(stderr);
      return;
    }
    const int step = int(frac * 20);
    if (step > last_step_) {
      last_step_ = step;
      std::fprintf(stderr, "aff-quantize: %3.0f%% %s/%s tensors %zu/%zu elapsed %s ETA %s\n", 100 * frac,
                   human_bytes(double(p.bytes_done)).c_str(), human_bytes(double(p.bytes_total)).c_str(),
                   p.tensors_done, p.tensors_total, human_seconds(p.elapsed_s).c_str(), human_seconds(eta).c_str());
    }
  }
  void finish() {
    if (tty_) std::fprintf(stderr, "\n");
  }

 private:
  bool tty_;
  int last_step_ = -1;
};

bool parse_int(const std::string& s, int* out) {
  char* end = nullptr;
  const long v = std::strtol(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || v < 0 || v > 1 << 20) return false;
  *out = int(v);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  QuantizeOptions o;
  o.threads = int(std::max(1u, std::thread::hardware_concurrency()));
  bool quiet = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      print_help(stdout);
      return 0;
    }
    if (a == "--quiet") {
      quiet = true;
      continue;
    }
    bool known = false;
    for (const auto& f : kFlags) known = known || (a == f.name && !f.metavar.empty());
    if (!known) return usage_error(fmt::format("unknown argument '{}'", a));
    if (i + 1 >= argc) return usage_error(fmt::format("{} needs a value", a));
    const std::string v = argv[++i];
    if (a == "--src") {
      o.src_dir = v;
    } else if (a == "--out") {
      o.out_path = v;
    } else if (a == "--recipe") {
      o.recipe = v;
    } else if (a == "--type") {
      auto rule = aff::quant::parse_type_rule(v);
      if (!rule) return usage_error(rule.status().message());
      o.rules.push_back(*rule);
    } else if (a == "--imatrix") {
      o.imatrix_path = v;
    } else if (a == "--layers") {
      if (!parse_int(v, &o.max_layers) || o.max_layers == 0) return usage_error("--layers needs a positive integer");
    } else if (a == "--threads") {
      if (!parse_int(v, &o.threads) || o.threads == 0) return usage_error("--threads needs a positive integer");
    }
  }
  if (o.src_dir.empty()) return usage_error("--src is required");
  if (o.out_path.empty()) return usage_error("--out is required");
  if (auto r = aff::quant::recipe_by_name(o.recipe); !r) return usage_error(r.status().message());

  ProgressPrinter printer(isatty(fileno(stderr)) != 0);
  if (!quiet) o.on_progress = [&](const QuantizeProgress& p) { printer(p); };
  o.on_note = [&](const std::string& s) {
    if (!quiet) std::fprintf(stderr, "aff-quantize: note: %s\n", s.c_str());
  };
  auto result = aff::quant::quantize_checkpoint(o);
  if (!quiet) printer.finish();
  if (!result) {
    std::fprintf(stderr, "aff-quantize: failed: %s\n", result.status().message().c_str());
    return 1;
  }
  const auto& s = *result;
  std::printf("wrote %s: %zu tensors, %s of tensor data in %.1f s\n", o.out_path.c_str(), s.n_tensors,
              human_bytes(double(s.data_bytes)).c_str(), s.seconds);
  for (const auto& [type, eb] : s.by_type) {
    std::printf("  %-8s %14llu weights %12s %6.3f bpw\n", type.c_str(), (unsigned long long)eb.first,
                human_bytes(double(eb.second)).c_str(), eb.first ? 8.0 * double(eb.second) / double(eb.first) : 0.0);
  }
  if (s.expert_elements) {
    std::printf("  routed experts: %s, %.3f bpw\n", human_bytes(double(s.expert_bytes)).c_str(),
                8.0 * double(s.expert_bytes) / double(s.expert_elements));
  }
  if (s.fallbacks) std::printf("  %zu tensors fell back to another type (row length vs block size)\n", s.fallbacks);
  if (!o.imatrix_path.empty()) {
    std::printf("  imatrix: %zu tensors weighted; expert popularity %s\n", s.imatrix_tensors,
                s.popularity_written ? "written" : "not available");
  }
  return 0;
}
