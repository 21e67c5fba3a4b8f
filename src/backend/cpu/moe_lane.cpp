#include "backend/cpu/moe_lane.h"

#include <omp.h>

#include <algorithm>
#include <vector>

#include "backend/cpu/act_quant.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/gemv.h"
#include "backend/cpu/linear_fast.h"
#include "backend/ref/activation.h"

namespace aff::cpu {
namespace {

// Rows per work item: small enough that 16 threads get even shares of a decode step's
// ~6 experts, large enough (32 rows x 0.5-4 KiB) that an item streams tens of KiB; a
// multiple of 16 floats so two threads never write one cache line of an output row.
constexpr int64_t kRowChunk = 32;

// Weight bytes x tokens below which the whole layer runs on the calling thread (as
// linear_fast: a fork costs tens of microseconds).
constexpr int64_t kParallelMinBytes = int64_t(256) << 10;

const GemvKernel& kernel_for(const dsv4::Linear& l) {
  return *select_gemv_kernel(quant::GgmlType(l.ggml_type), cpu_features());
}

int64_t row_bytes(const dsv4::Linear& l) { return l.weight.shape[1]; }

// Per-job scratch: offsets into the shared buffers below.
struct JobPlan {
  int64_t act_in = 0;   // quantised inputs: n x act_bytes(gate act, D)
  int64_t gate = 0;     // f32 [n, I] gate projections, then SwiGLU in place
  int64_t up = 0;       // f32 [n, I]
  int64_t act_mid = 0;  // quantised SwiGLU output: n x act_bytes(down act, I)
  int64_t chunks_in = 0;   // gate/up row chunks (of I rows)
  int64_t chunks_out = 0;  // down row chunks (of D rows)
};

// Maps a flat item index over all jobs to (job, index within job).
struct ItemIndex {
  std::vector<int64_t> start;  // start[j] = first item of job j; start.back() = total
  explicit ItemIndex(std::vector<int64_t> counts) : start(counts.size() + 1, 0) {
    for (size_t j = 0; j < counts.size(); ++j) start[j + 1] = start[j] + counts[j];
  }
  int64_t total() const { return start.back(); }
  std::pair<size_t, int64_t> locate(int64_t item) const {
    const size_t j = size_t(std::upper_bound(start.begin(), start.end(), item) - start.begin()) - 1;
    return {j, item - start[j]};
  }
};

}  // namespace

bool moe_lane_supported(const dsv4::ExpertWeights& e) {
  if (!cpu_lane_enabled()) return false;
  if (!linear_fast_supported(e.w1) || !linear_fast_supported(e.w3) || !linear_fast_supported(e.w2)) return false;
  if (kernel_for(e.w1).act != kernel_for(e.w3).act) return false;
  return e.w1.out == e.w3.out && e.w1.in == e.w3.in && e.w2.in == e.w1.out && e.w2.out == e.w1.in;
}

bool moe_lane_experts(std::span<const ExpertJob> jobs, float swiglu_limit) {
  for (const auto& j : jobs) {
    if (j.n > 0 && !moe_lane_supported(*j.e)) return false;
  }
  const size_t nj = jobs.size();
  std::vector<JobPlan> plan(nj);
  int64_t act_in_bytes = 0, f32_elems = 0, act_mid_bytes = 0, work_bytes = 0;
  std::vector<int64_t> tok_counts(nj), in_counts(nj), out_counts(nj);
  for (size_t i = 0; i < nj; ++i) {
    const auto& j = jobs[i];
    const int64_t n = std::max<int64_t>(0, j.n);
    const dsv4::ExpertWeights& e = *j.e;
    const int64_t D = e.w1.in, I = e.w1.out;
    JobPlan& p = plan[i];
    p.act_in = act_in_bytes;
    act_in_bytes += n * act_bytes(kernel_for(e.w1).act, D);
    p.gate = f32_elems;
    p.up = f32_elems + n * I;
    f32_elems += 2 * n * I;
    p.act_mid = act_mid_bytes;
    act_mid_bytes += n * act_bytes(kernel_for(e.w2).act, I);
    p.chunks_in = n > 0 ? (I + kRowChunk - 1) / kRowChunk : 0;
    p.chunks_out = n > 0 ? (D + kRowChunk - 1) / kRowChunk : 0;
    tok_counts[i] = n;
    in_counts[i] = p.chunks_in;
    out_counts[i] = p.chunks_out;
    if (n > 0) work_bytes += n * (e.w1.weight.nbytes + e.w3.weight.nbytes + e.w2.weight.nbytes);
  }
  std::vector<uint8_t> act_in(static_cast<size_t>(act_in_bytes)), act_mid(static_cast<size_t>(act_mid_bytes));
  std::vector<float> f32(static_cast<size_t>(f32_elems));
  const ItemIndex tok_items{tok_counts}, in_items{in_counts}, out_items{out_counts};
  const float L = swiglu_limit;

#pragma omp parallel if (work_bytes >= kParallelMinBytes)
  {
    // 1. Each token's input quantised once for gate and up.
#pragma omp for schedule(static)
    for (int64_t it = 0; it < tok_items.total(); ++it) {
      const auto [ji, t] = tok_items.locate(it);
      const ExpertJob& j = jobs[ji];
      const GemvKernel& k = kernel_for(j.e->w1);
      const int64_t D = j.e->w1.in;
      quantize_act(k.act, std::span<const float>(j.x + t * D, size_t(D)),
                   act_in.data() + plan[ji].act_in + t * act_bytes(k.act, D));
    }
    // 2. Gate and up rows, chunk by chunk; consecutive items are neighbouring rows of one
    //    expert. Guided: threads first take large contiguous runs (streaming contiguous
    //    weights), then ever smaller ones, so the barrier does not wait for the slowest
    //    thread's whole static share.
#pragma omp for schedule(guided)
    for (int64_t it = 0; it < in_items.total(); ++it) {
      const auto [ji, c] = in_items.locate(it);
      const ExpertJob& j = jobs[ji];
      const dsv4::ExpertWeights& e = *j.e;
      const int64_t D = e.w1.in, I = e.w1.out;
      const int64_t r0 = c * kRowChunk, nr = std::min(kRowChunk, I - r0);
      const uint8_t* a = act_in.data() + plan[ji].act_in;
      const GemvKernel& k1 = kernel_for(e.w1);
      const GemvKernel& k3 = kernel_for(e.w3);
      const int64_t stride = act_bytes(k1.act, D);
      gemm(k1, e.w1.weight.data + r0 * row_bytes(e.w1), row_bytes(e.w1), nr, D, a, stride, j.n,
           f32.data() + plan[ji].gate + r0, I);
      gemm(k3, e.w3.weight.data + r0 * row_bytes(e.w3), row_bytes(e.w3), nr, D, a, stride, j.n,
           f32.data() + plan[ji].up + r0, I);
    }
    // 3. SwiGLU (the expression of dsv4::expert_forward), quantised for the down projection.
#pragma omp for schedule(static)
    for (int64_t it = 0; it < tok_items.total(); ++it) {
      const auto [ji, t] = tok_items.locate(it);
      const dsv4::ExpertWeights& e = *jobs[ji].e;
      const int64_t I = e.w1.out;
      float* g = f32.data() + plan[ji].gate + t * I;
      const float* u = f32.data() + plan[ji].up + t * I;
      for (int64_t i = 0; i < I; ++i) {
        float gi = g[i], ui = u[i];
        if (L > 0.0f) {
          gi = std::min(gi, L);
          ui = std::clamp(ui, -L, L);
        }
        g[i] = ref::silu(gi) * ui;
      }
      const GemvKernel& k2 = kernel_for(e.w2);
      quantize_act(k2.act, std::span<const float>(g, size_t(I)),
                   act_mid.data() + plan[ji].act_mid + t * act_bytes(k2.act, I));
    }
    // 4. Down rows, chunk by chunk, straight into the job's output.
#pragma omp for schedule(guided)
    for (int64_t it = 0; it < out_items.total(); ++it) {
      const auto [ji, c] = out_items.locate(it);
      const ExpertJob& j = jobs[ji];
      const dsv4::ExpertWeights& e = *j.e;
      const int64_t D = e.w2.out, I = e.w2.in;
      const int64_t r0 = c * kRowChunk, nr = std::min(kRowChunk, D - r0);
      const GemvKernel& k2 = kernel_for(e.w2);
      gemm(k2, e.w2.weight.data + r0 * row_bytes(e.w2), row_bytes(e.w2), nr, I, act_mid.data() + plan[ji].act_mid,
           act_bytes(k2.act, I), j.n, j.y + r0, D);
    }
  }
  return true;
}

}  // namespace aff::cpu
