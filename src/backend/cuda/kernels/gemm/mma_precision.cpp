#include "backend/cuda/kernels/gemm/mma_precision.h"

#include <atomic>

namespace aff::cuda {
namespace {
std::atomic<MmaPrecision> g_precision{MmaPrecision::kBf16x3};
}  // namespace

MmaPrecision mma_precision() { return g_precision.load(std::memory_order_relaxed); }
void set_mma_precision(MmaPrecision p) { g_precision.store(p, std::memory_order_relaxed); }

}  // namespace aff::cuda
