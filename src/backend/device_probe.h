// GPUs visible to this build: the CUDA list in CUDA builds, empty otherwise.
#pragma once

#include <string>
#include <vector>

namespace aff {

struct GpuSummary {
  int ordinal = 0;
  std::string name;
  std::string arch;  // "sm_90"
  double total_gib = 0;
};

bool built_with_cuda();
std::vector<GpuSummary> probe_gpus(std::string* error = nullptr);

}  // namespace aff
