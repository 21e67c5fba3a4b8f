#include "backend/cuda/runtime/device_info.h"

#include <cuda_runtime.h>

#include <atomic>

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

int current_device_multiprocessors() {
  constexpr int kMaxDevices = 64, kFallback = 132;
  static std::atomic<int> count[kMaxDevices] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return kFallback;
  int n = count[dev].load(std::memory_order_relaxed);
  if (n == 0) {
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) n = kFallback;
    count[dev].store(n, std::memory_order_relaxed);
  }
  return n;
}

}  // namespace aff::cuda
