#include "backend/cuda/kernels/common/ggml_tables.h"

#include <cuda_runtime.h>

#include <cstring>
#include <memory>
#include <mutex>

#include "backend/cuda/runtime/cuda_check.h"
#include "quant/ggml_grids.h"

namespace aff::cuda {
namespace {

static_assert(sizeof(GgmlTables::iq2xxs_grid) == sizeof(quant::kIq2xxsGrid));
static_assert(sizeof(GgmlTables::iq2xs_grid) == sizeof(quant::kIq2xsGrid));
static_assert(sizeof(GgmlTables::iq1s_grid) == sizeof(quant::kIq1sGrid));
static_assert(sizeof(GgmlTables::iq3xxs_grid) == sizeof(quant::kIq3xxsGrid));
static_assert(sizeof(GgmlTables::signs_iq2xs) == sizeof(quant::kSignsIq2xs));
static_assert(sizeof(GgmlTables::values_iq4nl) == sizeof(quant::kValuesIq4nl));
static_assert(sizeof(GgmlTables::values_mxfp4) == sizeof(quant::kValuesMxfp4));

constexpr int kMaxDevices = 64;

}  // namespace

Result<const GgmlTables*> ggml_device_tables() {
  static std::mutex mu;
  static void* per_device[kMaxDevices] = {};  // never freed: lives as long as the process
  int dev = 0;
  AFF_CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
  if (dev < 0 || dev >= kMaxDevices) return internal_error("ggml tables: device id out of range");
  std::lock_guard<std::mutex> lock(mu);
  if (!per_device[dev]) {
    auto host = std::make_unique<GgmlTables>();
    std::memcpy(host->iq2xxs_grid, quant::kIq2xxsGrid, sizeof(host->iq2xxs_grid));
    std::memcpy(host->iq2xs_grid, quant::kIq2xsGrid, sizeof(host->iq2xs_grid));
    std::memcpy(host->iq1s_grid, quant::kIq1sGrid, sizeof(host->iq1s_grid));
    std::memcpy(host->iq3xxs_grid, quant::kIq3xxsGrid, sizeof(host->iq3xxs_grid));
    std::memcpy(host->signs_iq2xs, quant::kSignsIq2xs, sizeof(host->signs_iq2xs));
    std::memcpy(host->values_iq4nl, quant::kValuesIq4nl, sizeof(host->values_iq4nl));
    std::memcpy(host->values_mxfp4, quant::kValuesMxfp4, sizeof(host->values_mxfp4));
    void* p = nullptr;
    AFF_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, sizeof(GgmlTables)));
    const cudaError_t err = cudaMemcpy(p, host.get(), sizeof(GgmlTables), cudaMemcpyHostToDevice);
    if (err != cudaSuccess) {
      cudaFree(p);
      return cuda_status(err, "copying the ggml tables");
    }
    per_device[dev] = p;
  }
  return static_cast<const GgmlTables*>(per_device[dev]);
}

}  // namespace aff::cuda
