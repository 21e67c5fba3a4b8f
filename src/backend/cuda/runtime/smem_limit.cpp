#include "backend/cuda/runtime/smem_limit.h"

#include <cuda_runtime.h>

#include <map>
#include <mutex>

#include "backend/cuda/runtime/cuda_check.h"

namespace aff::cuda {

Status raise_smem_limit(const void* kernel, int bytes) {
  static std::mutex mu;
  static std::map<const void*, int> raised;  // kernel -> limit set
  std::lock_guard<std::mutex> lock(mu);
  auto it = raised.find(kernel);
  if (it != raised.end() && it->second >= bytes) return Status::ok();
  AFF_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  raised[kernel] = bytes;
  return Status::ok();
}

Status raise_smem_limits(std::initializer_list<SmemLimit> limits) {
  for (const SmemLimit& l : limits) AFF_RETURN_IF_ERROR(raise_smem_limit(l.kernel, l.bytes));
  return Status::ok();
}

}  // namespace aff::cuda
