// What the CUDA runtime reports about the GPUs on this machine. Compiled only
// when the build has a CUDA toolkit (AFFINITY_HAS_CUDA); callers use
// backend/device_probe.h, which also answers in CPU-only builds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace aff::cuda {

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int sm_major = 0, sm_minor = 0;
  int multiprocessors = 0;
  uint64_t total_bytes = 0;
  uint64_t free_bytes = 0;
};

// Empty when the driver is missing or no device is visible (never throws).
std::vector<DeviceInfo> list_devices(std::string* error = nullptr);

// Multiprocessors of the calling thread's current device, cached per device,
// for sizing grids; 132 (an H200) if the runtime cannot say.
int current_device_multiprocessors();

}  // namespace aff::cuda
