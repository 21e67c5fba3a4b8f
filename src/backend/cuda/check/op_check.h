// GPU-vs-CPU-reference checker: runs every op of the forward pass, single
// layers' attention and MoE over several chunks, and whole-model prefill and
// decode on both backends with one model's weights and fresh random inputs,
// and reports the relative RMS error of each. Used by aff-gpucheck and by the
// GPU tests, so both hold the CUDA backend to the same contract. The CPU side
// is the f32 reference: the CPU lane (quantised activations) is off while the
// checker runs.
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
// Ops whose GPU path rounds beyond f32 by design, against the f32 reference:
// ggml-stored weights (a GGUF container's routed experts) quantise activations
// to int8 per 32 on the GEMV, and ggml and split Q8_0 (kQ8) weights are
// rounded to bf16 for the prefill GEMM (2^-9 per weight). Issue 5's bound where
// such rounding is allowed (measured 2e-3..7e-3 on the tiny model's ops).
constexpr double kTolRounded = 2e-2;

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
  // The whole-model checks compare the backends only on tokens whose learned
  // routing has no near-tie: a selection decided by less than the backends'
  // score difference may pick other experts on the GPU, and outputs of another
  // expert choice differ far beyond rounding (the rare 5e-3..1e-2 failures in
  // docs/NOTES.md). The CPU reference's smallest top-k gap (score + bias,
  // dsv4/routing_margin.h) over the prefill and decode tokens must be >=
  // routing_margin, else the tokens are redrawn, routing_attempts draws at
  // most. 0 takes the first draw (its gap is still reported).
  // Why 3e-4: the GPU's activations differ from the CPU's by ~2e-6 relative,
  // its router scores (O(1)) by ~1e-5 (bias noise of 1e-5 flips CPU routing
  // about as often as the checker failed, docs/BENCHMARKS.md; 2% of tiny-v4's
  // 37 + 3 token draws have a gap below 1e-5), so 3e-4 leaves 30x. Wider
  // costs draws: on tiny-v4 50% of draws fall below 3e-4 (32 attempts all do
  // with odds ~2^-32) but 89% below 1e-3 (32 attempts would run out in 2% of
  // runs). The random test models (6 experts) reject 8-14% at 3e-4. Models of
  // full size (256 experts, 43 layers) may have no draw that clears it.
  double routing_margin = 3e-4;
  int routing_attempts = 32;
  std::function<void(const OpResult&)> on_result;  // progress callback (may be empty)
};

// Runs all checks; a non-ok Status only for failures to run (CUDA errors,
// unsupported formats), never for numeric disagreement. The result
// "model.routing_margin" says which draw of the whole-model tokens was used
// and its smallest routing gap (error 0); error 1 when no draw cleared the
// margin (the whole-model checks then ran on the draw with the widest gap).
Result<std::vector<OpResult>> check_ops(const dsv4::LoadedModel& model, const DeviceModel& dev,
                                        const OpCheckOptions& opts);

// The worst result of each op name, in first-seen order.
std::vector<OpResult> worst_per_op(const std::vector<OpResult>& results);

// sqrt(sum (got - want)^2 / sum want^2) (plain RMS when want is all zero).
double rel_rms(const float* got, const float* want, size_t n);

}  // namespace aff::cuda
