// The GPU seam's two builds: with CUDA it wraps the CUDA backend's
// DeviceModel / GpuState / gpu_forward; without, it says so.
#include "runtime/gpu_backend.h"

#include "backend/device_probe.h"
#include "model/dsv4/forward.h"

#ifdef AFFINITY_HAS_CUDA
#include "backend/cuda/cuda_forward.h"
#include "backend/cuda/gpu_state.h"
#include "backend/cuda/runtime/device_model.h"
#endif

namespace aff::runtime {

bool gpu_backend_built() { return built_with_cuda(); }

#ifdef AFFINITY_HAS_CUDA
namespace {

class CudaTimeline final : public GpuTimeline {
 public:
  CudaTimeline(const cuda::DeviceModel& model, std::unique_ptr<cuda::GpuState> state, const dsv4::ForwardOptions& fwd)
      : model_(model), state_(std::move(state)), fwd_(fwd) {}

  Status eval(std::span<const int32_t> tokens, bool all_positions, std::vector<float>& logits) override {
    // Back the caches for the whole chunk first: growth happens on the host,
    // never inside a (captured) forward pass.
    AFF_RETURN_IF_ERROR(cuda::gpu_state_reserve(*state_, state_->n_past + int64_t(tokens.size())));
    return cuda::gpu_forward(model_, *state_, tokens, all_positions, logits, fwd_);
  }
  int64_t n_past() const override { return state_->n_past; }
  void reset() override { cuda::gpu_state_reset(*state_); }

 private:
  const cuda::DeviceModel& model_;
  std::unique_ptr<cuda::GpuState> state_;
  dsv4::ForwardOptions fwd_;
};

class CudaModel final : public GpuModel {
 public:
  CudaModel(std::unique_ptr<cuda::DeviceModel> model, GpuBackendOptions opts, std::string gpu)
      : model_(std::move(model)), opts_(opts), gpu_(std::move(gpu)) {}

  Result<std::unique_ptr<GpuTimeline>> new_timeline(int64_t max_positions, const dsv4::ForwardOptions& fwd) override {
    cuda::GpuStateOptions so;
    so.kv_size = std::max<int64_t>(1, std::min(max_positions, opts_.kv_size));
    so.kv_commit = std::min(opts_.kv_commit, so.kv_size);
    so.max_chunk = opts_.max_chunk;
    AFF_ASSIGN_OR_RETURN(auto state, cuda::make_gpu_state(*model_, so));
    return std::unique_ptr<GpuTimeline>(std::make_unique<CudaTimeline>(*model_, std::move(state), fwd));
  }
  std::string description() const override {
    return gpu_ + ", " + std::to_string(model_->device_bytes() >> 20) + " MiB of weights";
  }

 private:
  std::unique_ptr<cuda::DeviceModel> model_;
  GpuBackendOptions opts_;
  std::string gpu_;
};

}  // namespace

Result<std::unique_ptr<GpuModel>> load_gpu_model(const dsv4::LoadedModel& model, const GpuBackendOptions& options) {
  std::string error;
  const auto gpus = probe_gpus(&error);
  if (gpus.empty()) return unsupported("no CUDA device visible" + (error.empty() ? "" : " (" + error + ")"));
  AFF_ASSIGN_OR_RETURN(auto dev, cuda::upload_model(model));
  return std::unique_ptr<GpuModel>(
      std::make_unique<CudaModel>(std::move(dev), options, gpus[0].name + " (" + gpus[0].arch + ")"));
}

#else

Result<std::unique_ptr<GpuModel>> load_gpu_model(const dsv4::LoadedModel&, const GpuBackendOptions&) {
  return unsupported("this build has no CUDA backend (configure with a CUDA toolkit)");
}

#endif

}  // namespace aff::runtime
