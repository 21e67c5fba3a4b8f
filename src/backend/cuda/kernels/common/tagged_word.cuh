// Values handed from one step of a persistent launch to the next as tagged
// 64-bit words: the value's bits in the low half, the step (+ 1) in the high
// half, written and read as one single-copy-atomic access, so a reader that
// sees the tag sees the value (no fence, no counter between the steps).
// Used by gemv_chain.cu and the hand-over probe (misc/handoff_probe.cu).
#pragma once

namespace aff::cuda {

__device__ __forceinline__ void st_volatile_u64(unsigned long long* p, unsigned long long v) {
  asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ ulonglong2 ld_volatile_u64x2(const unsigned long long* p) {
  ulonglong2 v;
  asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(v.x), "=l"(v.y) : "l"(p) : "memory");
  return v;
}

}  // namespace aff::cuda
