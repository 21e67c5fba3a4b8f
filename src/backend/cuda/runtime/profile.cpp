#include "backend/cuda/runtime/profile.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cuda/runtime/env_switch.h"

namespace aff::cuda {
namespace {

struct Mark {
  const char* name;
  cudaEvent_t event;
};

struct Profile {
  std::mutex mu;
  std::vector<Mark> marks;                  // the current step's marks, in order
  std::vector<cudaEvent_t> pool;            // reusable events
  std::map<std::string, double> total_ms;   // summed per stage name
  int steps = 0;

  ~Profile() {
    if (total_ms.empty()) return;
    double all = 0.0;
    for (const auto& [name, ms] : total_ms) all += ms;
    std::fprintf(stderr, "\nGPU time by stage over %d steps (AFF_CUDA_PROFILE):\n", steps);
    std::fprintf(stderr, "  %-24s %12s %12s %7s\n", "stage", "ms total", "ms/step", "share");
    for (const auto& [name, ms] : total_ms)
      std::fprintf(stderr, "  %-24s %12.3f %12.4f %6.1f%%\n", name.c_str(), ms, ms / std::max(steps, 1),
                   100.0 * ms / all);
    std::fprintf(stderr, "  %-24s %12.3f %12.4f\n", "all", all, all / std::max(steps, 1));
  }
};

Profile& profile() {
  static Profile p;
  return p;
}

}  // namespace

bool profiling_enabled() {
  static const bool on = env_opt_in("AFF_CUDA_PROFILE");
  return on;
}

bool ablated(const char* stage) {
  // ",a,b," so that a stage matches only as a whole item.
  static const std::string list = [] {
    const char* v = std::getenv("AFF_CUDA_ABLATE");
    std::string l;
    if (v != nullptr) l.append(",").append(v).append(",");
    return l;
  }();
  if (list.empty()) return false;
  std::string item(",");
  item.append(stage).append(",");
  return list.find(item) != std::string::npos;
}

void prof_mark(cudaStream_t stream, const char* name) {
  if (!profiling_enabled()) return;
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) return;
  Profile& p = profile();
  std::lock_guard<std::mutex> lock(p.mu);
  cudaEvent_t e = nullptr;
  if (!p.pool.empty()) {
    e = p.pool.back();
    p.pool.pop_back();
  } else if (cudaEventCreate(&e) != cudaSuccess) {
    return;
  }
  cudaEventRecord(e, stream);
  p.marks.push_back({name, e});
}

void prof_step_end(cudaStream_t stream) {
  if (!profiling_enabled()) return;
  cudaStreamSynchronize(stream);
  Profile& p = profile();
  std::lock_guard<std::mutex> lock(p.mu);
  for (size_t i = 1; i < p.marks.size(); ++i) {
    float ms = 0.0f;
    if (cudaEventElapsedTime(&ms, p.marks[i - 1].event, p.marks[i].event) == cudaSuccess) {
      p.total_ms[p.marks[i].name] += ms;
    }
  }
  for (const Mark& m : p.marks) p.pool.push_back(m.event);
  p.marks.clear();
  ++p.steps;
}

}  // namespace aff::cuda
