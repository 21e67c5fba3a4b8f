#include "backend/device_probe.h"

#ifdef AFFINITY_HAS_CUDA
#include "backend/cuda/runtime/device_info.h"
#endif

namespace aff {

bool built_with_cuda() {
#ifdef AFFINITY_HAS_CUDA
  return true;
#else
  return false;
#endif
}

std::vector<GpuSummary> probe_gpus(std::string* error) {
  std::vector<GpuSummary> out;
#ifdef AFFINITY_HAS_CUDA
  for (const auto& d : cuda::list_devices(error)) {
    out.push_back({d.ordinal, d.name, "sm_" + std::to_string(d.sm_major) + std::to_string(d.sm_minor),
                   double(d.total_bytes) / double(1ull << 30)});
  }
#else
  if (error) *error = "built without CUDA";
#endif
  return out;
}

}  // namespace aff
