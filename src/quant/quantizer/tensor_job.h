// One unit of quantisation work: rows [row_begin, row_end) of matrix `mat` of a planned
// tensor, producing exactly the bytes those rows occupy in the output. A job reads only
// its source rows (through the mapping) and its importance row, so jobs run in any order
// on any thread and give the same bytes.
#pragma once

#include <cstdint>
#include <vector>

#include "affinity/status.h"
#include "quant/imatrix.h"
#include "quant/quantizer/tensor_plan.h"

namespace aff::quant {

struct TensorJob {
  size_t tensor = 0;      // index into the plan
  int64_t mat = 0;        // expert (0 for a 2-D tensor)
  int64_t row_begin = 0;
  int64_t row_end = 0;
};

// Splits every tensor of the plan into jobs of about `target_elems` input values each,
// in file order (tensor, matrix, rows).
std::vector<TensorJob> make_jobs(const std::vector<PlannedTensor>& plan, int64_t target_elems = int64_t(1) << 22);

// Runs one job into `out` (resized to (row_end - row_begin) * row_bytes). imatrix may be
// null. Fails, naming the tensor and row, on non-finite source values or an imatrix
// entry that does not fit the tensor.
Status run_job(const PlannedTensor& t, const TensorJob& job, const Imatrix* imatrix, std::vector<uint8_t>* out);

}  // namespace aff::quant
