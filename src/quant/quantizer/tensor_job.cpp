#include "quant/quantizer/tensor_job.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "backend/ref/linear.h"
#include "quant/codec.h"

namespace aff::quant {

std::vector<TensorJob> make_jobs(const std::vector<PlannedTensor>& plan, int64_t target_elems) {
  std::vector<TensorJob> jobs;
  for (size_t i = 0; i < plan.size(); ++i) {
    const PlannedTensor& t = plan[i];
    const int64_t rows_per_job = std::max<int64_t>(1, target_elems / std::max<int64_t>(1, t.ne[0]));
    for (int64_t m = 0; m < t.n_mat(); ++m) {
      for (int64_t r = 0; r < t.rows; r += rows_per_job) {
        jobs.push_back({i, m, r, std::min(t.rows, r + rows_per_job)});
      }
    }
  }
  return jobs;
}

Status run_job(const PlannedTensor& t, const TensorJob& job, const Imatrix* imatrix, std::vector<uint8_t>* out) {
  const int64_t n_rows = job.row_end - job.row_begin;
  out->resize(size_t(n_rows * t.row_bytes));
  const int64_t in = t.ne[0];
  if (t.role == TensorRole::kExpertIds) {
    // I64 or I32 ids -> I32, already range-checked by the loader.
    for (int64_t r = job.row_begin; r < job.row_end; ++r) {
      for (int64_t k = 0; k < in; ++k) {
        const int64_t i = r * in + k;
        const int32_t v = t.ids.dtype == DType::kI64 ? int32_t(t.ids.as<int64_t>()[i]) : t.ids.as<int32_t>()[i];
        std::memcpy(out->data() + ((r - job.row_begin) * in + k) * 4, &v, 4);
      }
    }
    return Status::ok();
  }
  std::span<const float> importance;
  if (imatrix != nullptr && ggml_traits(t.type.type).quantized) {
    AFF_ASSIGN_OR_RETURN(importance, imatrix->importance(t.name, in, t.n_mat(), job.mat));
  }
  const dsv4::Linear& src = t.mats[size_t(job.mat)];
  std::vector<float> row(static_cast<size_t>(in));
  for (int64_t r = job.row_begin; r < job.row_end; ++r) {
    ref::linear_dequant_row(src, r, row.data());
    for (int64_t i = 0; i < in; ++i) {
      if (!std::isfinite(row[size_t(i)])) {
        return corrupt(fmt::format("{}: tensor '{}' (-> {}): non-finite value at row {}, column {}", src.weight.file,
                                   src.weight.name, t.name, r, i));
      }
    }
    std::span<uint8_t> dst(out->data() + (r - job.row_begin) * t.row_bytes, size_t(t.row_bytes));
    const Status st = quantize_row(t.type.type, row, dst, importance);
    if (!st.is_ok()) return st.with_context(fmt::format("tensor '{}' row {}", t.name, r));
  }
  return Status::ok();
}

}  // namespace aff::quant
