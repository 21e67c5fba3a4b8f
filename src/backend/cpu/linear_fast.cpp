#include "backend/cpu/linear_fast.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "backend/cpu/act_quant.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/gemv.h"
#include "core/check.h"

namespace aff::cpu {
namespace {

// -1: not yet read from the environment; 0 off; 1 on.
std::atomic<int> g_lane{-1};

// Weight bytes x tokens below which one thread does the whole linear: forking a team
// costs tens of microseconds, the lane streams ~5-10 GB/s per core, so splitting pays
// from a few hundred KiB of work.
constexpr int64_t kParallelMinBytes = int64_t(256) << 10;

// Rows per thread are rounded to this so threads rarely share a cache line of y.
constexpr int64_t kRowAlign = 16;

}  // namespace

bool cpu_lane_enabled() {
  int v = g_lane.load(std::memory_order_relaxed);
  if (v < 0) {
    const char* e = std::getenv("AFF_CPU_LANE");
    v = (e != nullptr && std::strcmp(e, "0") == 0) ? 0 : 1;
    g_lane.store(v, std::memory_order_relaxed);
  }
  return v != 0;
}

void set_cpu_lane_enabled(bool on) { g_lane.store(on ? 1 : 0, std::memory_order_relaxed); }

bool linear_fast_supported(const dsv4::Linear& w) {
  if (w.format != dsv4::WeightFormat::kGgml || !w.valid() || w.ggml_type < 0) return false;
  const auto type = quant::GgmlType(w.ggml_type);
  if (!gemv_has_kernels(type)) return false;
  const GemvKernel* k = select_gemv_kernel(type, cpu_features());
  // The scalar kernel dequantises rows like the reference does, but with the activation
  // rounded: slower and less exact, so the reference path is better there.
  if (k == nullptr || k->isa == Isa::kScalar) return false;
  return w.in % act_block_elems(k->act) == 0 && w.weight.shape.size() == 2;
}

bool linear_fast_rows(const dsv4::Linear& w, int64_t row_begin, int64_t row_end, const float* x, int64_t ldx,
                      int64_t T, float* y, int64_t ldy) {
  if (!cpu_lane_enabled() || !linear_fast_supported(w)) return false;
  AFF_CHECK(row_begin >= 0 && row_begin <= row_end && row_end <= w.out);
  const int64_t n_rows = row_end - row_begin;
  if (n_rows == 0 || T == 0) return true;
  const GemvKernel& k = *select_gemv_kernel(quant::GgmlType(w.ggml_type), cpu_features());
  const int64_t in = w.in;
  const int64_t row_bytes = w.weight.shape[1];
  const int64_t act_stride = act_bytes(k.act, in);
  const uint8_t* w0 = w.weight.data + row_begin * row_bytes;

  // Each token's activation is quantised once and read by every row. The buffer is the
  // calling thread's; the team below reaches it through `a` only.
  thread_local std::vector<uint8_t> act;
  act.resize(size_t(T * act_stride));
  uint8_t* const a = act.data();
  const bool parallel = n_rows * row_bytes * T >= kParallelMinBytes;
#pragma omp parallel for schedule(static) if (parallel && T > 1)
  for (int64_t t = 0; t < T; ++t) {
    quantize_act(k.act, std::span<const float>(x + t * ldx, size_t(in)), a + t * act_stride);
  }
  if (!parallel) {
    gemm(k, w0, row_bytes, n_rows, in, a, act_stride, T, y, ldy);
    return true;
  }
#pragma omp parallel
  {
    // Contiguous row ranges: each thread streams its own part of W once for all T tokens.
    const int64_t nt = omp_get_num_threads(), ti = omp_get_thread_num();
    const int64_t chunks = (n_rows + kRowAlign - 1) / kRowAlign;
    const int64_t r0 = std::min(n_rows, chunks * ti / nt * kRowAlign);
    const int64_t r1 = std::min(n_rows, chunks * (ti + 1) / nt * kRowAlign);
    if (r1 > r0) gemm(k, w0 + r0 * row_bytes, row_bytes, r1 - r0, in, a, act_stride, T, y + r0, ldy);
  }
  return true;
}

}  // namespace aff::cpu
