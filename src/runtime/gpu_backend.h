// The seam between the Engine and a GPU backend: the Engine sees a loaded
// GPU model and per-session timelines, never CUDA types, so src/runtime and
// CPU-only builds need no CUDA headers. In a build without CUDA every entry
// point answers "unsupported".
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "affinity/status.h"

namespace aff {
namespace dsv4 {
struct LoadedModel;
struct ForwardOptions;
}  // namespace dsv4

namespace runtime {

// One sequence's state on the GPU.
class GpuTimeline {
 public:
  virtual ~GpuTimeline() = default;
  // Runs tokens at positions [n_past, n_past + T). logits: [T, vocab] when
  // all_positions, else [vocab] (the last token).
  virtual Status eval(std::span<const int32_t> tokens, bool all_positions, std::vector<float>& logits) = 0;
  virtual int64_t n_past() const = 0;
  virtual void reset() = 0;
};

struct GpuBackendOptions {
  int64_t kv_size = 1048576;  // positions of KV address space per session
  int64_t kv_commit = 8192;   // positions backed when a session starts
  int64_t max_chunk = 4096;   // tokens per forward call (bounds the workspace)
};

class GpuModel {
 public:
  virtual ~GpuModel() = default;
  // A timeline for at most max_positions positions (clamped to kv_size).
  virtual Result<std::unique_ptr<GpuTimeline>> new_timeline(int64_t max_positions,
                                                            const dsv4::ForwardOptions& fwd) = 0;
  virtual std::string description() const = 0;  // "NVIDIA H200 (sm_90), 1234 MiB of weights"
};

bool gpu_backend_built();
// Copies the model's weights to GPU 0. Fails with a Status that says why
// (no CUDA in this build, no device, a weight format the GPU cannot read).
Result<std::unique_ptr<GpuModel>> load_gpu_model(const dsv4::LoadedModel& model, const GpuBackendOptions& options);

}  // namespace runtime
}  // namespace aff
