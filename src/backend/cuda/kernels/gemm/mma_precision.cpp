#include "backend/cuda/kernels/gemm/mma_precision.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace aff::cuda {
namespace {

// AFF_CUDA_PRECISION=bf16 starts the process in the fast setting (anything
// else, or nothing, keeps the exact one); set_mma_precision overrides it.
MmaPrecision initial_precision() {
  const char* v = std::getenv("AFF_CUDA_PRECISION");
  return v && std::strcmp(v, "bf16") == 0 ? MmaPrecision::kBf16 : MmaPrecision::kBf16x3;
}

std::atomic<MmaPrecision> g_precision{initial_precision()};

}  // namespace

MmaPrecision mma_precision() { return g_precision.load(std::memory_order_relaxed); }
void set_mma_precision(MmaPrecision p) { g_precision.store(p, std::memory_order_relaxed); }

}  // namespace aff::cuda
