// aff-gpucheck -m MODEL: runs every op of the forward pass, single layers and
// the whole model on the GPU and on the CPU reference with the model's own
// weights, prints the worst relative error per op, and exits non-zero when
// any op is outside its tolerance (or the GPU path cannot run).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backend/device_probe.h"
#include "model/dsv4/load_gguf.h"
#include "model/dsv4/loaded_model.h"

#ifdef AFFINITY_HAS_CUDA
#include "backend/cuda/check/op_check.h"
#include "backend/cuda/runtime/device_model.h"
#endif

namespace {

void usage() {
  std::fprintf(stderr,
               "usage: aff-gpucheck -m MODEL [--seed N] [--tokens N] [--model-tokens N] [--decode-steps N]\n"
               "                    [--experts N] [--routing-margin X] [--routing-attempts N] [--verbose]\n"
               "  -m MODEL          checkpoint directory (or .gguf file) to check\n"
               "  --seed N          random inputs seed (default: 1)\n"
               "  --tokens N        rows of each per-op input (default: 7)\n"
               "  --model-tokens N  whole-model prefill length (default: 37)\n"
               "  --decode-steps N  whole-model decode steps (default: 3)\n"
               "  --experts N       routed experts per layer checked as linears (default: 2)\n"
               "  --routing-margin X  smallest top-k routing gap the whole-model tokens must have on the\n"
               "                    CPU reference, else they are redrawn (default: 3e-4; 0 takes the first draw)\n"
               "  --routing-attempts N  draws tried for that margin, each one CPU forward (default: 32;\n"
               "                    large models rarely clear it and pay for every draw: try 1-4)\n"
               "  --verbose         print every check, not only the worst per op\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path;
  bool verbose = false;
#ifdef AFFINITY_HAS_CUDA
  aff::cuda::OpCheckOptions opts;
#endif
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* name) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "aff-gpucheck: %s needs a value\n", name);
        std::exit(2);
      }
      return argv[++i];
    };
    auto number = [&](const char* name) -> long long {
      const char* v = value(name);
      char* end = nullptr;
      const long long n = std::strtoll(v, &end, 10);
      if (!end || *end || n < 0) {
        std::fprintf(stderr, "aff-gpucheck: %s expects a non-negative integer, got '%s'\n", name, v);
        std::exit(2);
      }
      return n;
    };
    auto real = [&](const char* name) -> double {
      const char* v = value(name);
      char* end = nullptr;
      const double x = std::strtod(v, &end);
      if (!end || *end || !(x >= 0.0) || !std::isfinite(x)) {
        std::fprintf(stderr, "aff-gpucheck: %s expects a non-negative number, got '%s'\n", name, v);
        std::exit(2);
      }
      return x;
    };
    if (a == "-m" || a == "--model") {
      model_path = value("-m");
    } else if (a == "--verbose" || a == "-v") {
      verbose = true;
    } else if (a == "-h" || a == "--help") {
      usage();
      return 0;
#ifdef AFFINITY_HAS_CUDA
    } else if (a == "--seed") {
      opts.seed = uint64_t(number("--seed"));
    } else if (a == "--tokens") {
      opts.tokens = std::max(1LL, number("--tokens"));
    } else if (a == "--model-tokens") {
      opts.model_tokens = std::max(1LL, number("--model-tokens"));
    } else if (a == "--decode-steps") {
      opts.decode_steps = int(number("--decode-steps"));
    } else if (a == "--experts") {
      opts.experts_per_layer = int(number("--experts"));
    } else if (a == "--routing-attempts") {
      opts.routing_attempts = int(std::max(1LL, number("--routing-attempts")));
    } else if (a == "--routing-margin") {
      opts.routing_margin = real("--routing-margin");
#else
    } else if (a == "--seed" || a == "--tokens" || a == "--model-tokens" || a == "--decode-steps" ||
               a == "--experts" || a == "--routing-attempts") {
      (void)number(a.c_str());
    } else if (a == "--routing-margin") {
      (void)real(a.c_str());
#endif
    } else {
      std::fprintf(stderr, "aff-gpucheck: unknown argument '%s'\n", a.c_str());
      usage();
      return 2;
    }
  }
  if (model_path.empty()) {
    usage();
    return 2;
  }
#ifndef AFFINITY_HAS_CUDA
  (void)verbose;
  std::fprintf(stderr, "aff-gpucheck: this build has no CUDA backend (configure with a CUDA toolkit)\n");
  return 3;
#else
  std::string probe_error;
  const auto gpus = aff::probe_gpus(&probe_error);
  if (gpus.empty()) {
    std::fprintf(stderr, "aff-gpucheck: no CUDA device visible%s%s\n", probe_error.empty() ? "" : ": ",
                 probe_error.c_str());
    return 3;
  }
  std::printf("device: %s (%s, %.1f GiB)\n", gpus[0].name.c_str(), gpus[0].arch.c_str(), gpus[0].total_gib);

  const bool gguf = model_path.size() > 5 && model_path.compare(model_path.size() - 5, 5, ".gguf") == 0;
  auto loaded = gguf ? aff::dsv4::load_gguf_file(model_path) : aff::dsv4::load_checkpoint_dir(model_path);
  if (!loaded.is_ok()) {
    std::fprintf(stderr, "aff-gpucheck: %s\n", loaded.status().message().c_str());
    return 1;
  }
  const aff::dsv4::LoadedModel& model = **loaded;
  auto dev = aff::cuda::upload_model(model);
  if (!dev.is_ok()) {
    std::fprintf(stderr, "aff-gpucheck: %s\n", dev.status().message().c_str());
    return 1;
  }
  std::printf("model: %s (%d layers, D %lld), %.1f MiB on the device\n", model_path.c_str(),
              model.config.num_layers, (long long)model.config.hidden_size,
              double((*dev)->device_bytes()) / double(1 << 20));
  if (verbose)
    opts.on_result = [](const aff::cuda::OpResult& r) {
      std::printf("  %-20s %-40s %.3e %s\n", r.op.c_str(), r.detail.c_str(), r.error, r.ok() ? "" : "FAIL");
      std::fflush(stdout);
    };
  auto results = aff::cuda::check_ops(model, **dev, opts);
  if (!results.is_ok()) {
    std::fprintf(stderr, "aff-gpucheck: %s\n", results.status().message().c_str());
    return 1;
  }
  int failed = 0;
  for (const auto& r : *results) failed += !r.ok();
  std::printf("%-20s %-12s %-10s %-6s %s\n", "op", "worst error", "tolerance", "result", "where");
  for (const auto& r : aff::cuda::worst_per_op(*results))
    std::printf("%-20s %-12.3e %-10.1e %-6s %s\n", r.op.c_str(), r.error, r.tolerance, r.ok() ? "ok" : "FAIL",
                r.detail.c_str());
  std::printf("%zu checks, %d failed\n", results->size(), failed);
  return failed == 0 ? 0 : 1;
#endif
}
