// GPU-vs-CPU-reference checker: runs every op of the forward pass, single
// layers' attention and MoE over several chunks, and whole-model prefill and
// decode on both backends with one model's weights and fresh random inputs,
// and reports the relative RMS error of each. Used by aff-gpucheck and by the
// GPU tests, so both hold the CUDA backend to the same contract.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "affinity/status.h"
#include "backend/cuda/runtime/device_model.h"
#include "model/dsv4/loaded_model.h"

namespace aff::cuda {

// f32 math on both sides, summation order differs: errors are rounding only.
constexpr double kTolOpF32 = 1e-4;
// Whole model (all layers, head): rounding differences compound through
// normalisations and softmaxes.
constexpr double kTolModelF32 = 1e-3;
// Discrete outputs (routing ids, greedy tokens): fraction that differs.
constexpr double kTolDiscrete = 0.0;

struct OpResult {
  std::string op;      // "linear.fp8", "attention.csa", "forward.decode", ...
  std::string detail;  // which tensor / layer / chunk
  double error = 0.0;  // relative RMS (or mismatch fraction for discrete ops)
  double tolerance = 0.0;
  bool ok() const { return error <= tolerance; }
};

struct OpCheckOptions {
  uint64_t seed = 1;
  int64_t tokens = 7;           // rows of the per-op random inputs
  int experts_per_layer = 2;    // routed experts checked as linears per layer (first and last)
  int64_t model_tokens = 37;    // whole-model prefill length
  int decode_steps = 3;         // whole-model decode steps after the prefill
  int64_t max_chunk = 64;       // GPU state chunk size (prefill is split into chunks of this)
  std::function<void(const OpResult&)> on_result;  // progress callback (may be empty)
};

// Runs all checks; a non-ok Status only for failures to run (CUDA errors,
// unsupported formats), never for numeric disagreement.
Result<std::vector<OpResult>> check_ops(const dsv4::LoadedModel& model, const DeviceModel& dev,
                                        const OpCheckOptions& opts);

// The worst result of each op name, in first-seen order.
std::vector<OpResult> worst_per_op(const std::vector<OpResult>& results);

// sqrt(sum (got - want)^2 / sum want^2) (plain RMS when want is all zero).
double rel_rms(const float* got, const float* want, size_t n);

}  // namespace aff::cuda
