// L2 prefetch of a byte range through the bulk-copy engine.
//
// One `cp.async.bulk.prefetch.L2` asks the copy engine for a whole range: the
// bytes stream in at the rate HBM gives, costing the issuing thread no
// registers or shared memory. It is a hint: nothing completes, nothing is
// waited on, and it never changes a result.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace aff::cuda {

// Asks for [p, p + bytes) in L2, shrunk to 16-byte boundaries (the copy
// engine's unit; a few edge bytes are simply not prefetched), in pieces of at
// most 64 KB.
__device__ __forceinline__ void l2_prefetch(const void* p, int64_t bytes) {
  uintptr_t b = (reinterpret_cast<uintptr_t>(p) + 15) & ~uintptr_t(15);
  const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + uintptr_t(bytes > 0 ? bytes : 0)) & ~uintptr_t(15);
  constexpr uintptr_t kPiece = 64 * 1024;
  while (b < e) {
    const uint32_t n = uint32_t(e - b < kPiece ? e - b : kPiece);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(b), "r"(n) : "memory");
    b += n;
  }
}

}  // namespace aff::cuda
