#include "backend/cuda/runtime/device_info.h"

#include <cuda_runtime.h>

namespace aff::cuda {

std::vector<DeviceInfo> list_devices(std::string* error) {
  std::vector<DeviceInfo> out;
  int n = 0;
  cudaError_t st = cudaGetDeviceCount(&n);
  if (st != cudaSuccess) {
    if (error) *error = cudaGetErrorString(st);
    cudaGetLastError();  // clear the sticky error so later probes start clean
    return out;
  }
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    DeviceInfo d;
    d.ordinal = i;
    d.name = prop.name;
    d.sm_major = prop.major;
    d.sm_minor = prop.minor;
    d.multiprocessors = prop.multiProcessorCount;
    d.total_bytes = prop.totalGlobalMem;
    size_t free_b = 0, total_b = 0;
    if (cudaSetDevice(i) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
      d.free_bytes = free_b;
    out.push_back(d);
  }
  return out;
}

}  // namespace aff::cuda
