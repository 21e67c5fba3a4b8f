// A LoadedModel's weights on one GPU, in their stored formats (no dequantised
// copies): one arena allocation holds every tensor; small vectors (norm
// weights, sinks, ape, biases, mHC base/scale) are widened to f32 because the
// kernels read them once per row and they are a negligible share of the bytes.
// Experts are reached through per-layer slot tables (ExpertSlot), the seam a
// tiered expert store will use to place experts in VRAM or pinned host memory.
#pragma once

#include <memory>
#include <vector>

#include "affinity/status.h"
#include "backend/cuda/runtime/device_buffer.h"
#include "backend/cuda/runtime/device_weights.h"
#include "model/dsv4/loaded_model.h"

namespace aff::cuda {

struct DeviceHc {
  DeviceLinear fn;               // [n_mix, hc*D] (site: n_mix = (2+hc)*hc; head: hc)
  const float* base = nullptr;   // [n_mix]
  const float* scale = nullptr;  // [3] (site) or [1] (head)
};

struct DeviceCompressor {
  bool present = false;
  int ratio = 0, dim = 0;
  bool overlap = false;
  DeviceLinear wkv, wgate;       // [c*dim, D]
  const float* ape = nullptr;    // [ratio, c*dim]
  const float* norm = nullptr;   // [dim]
};

struct DeviceIndexer {
  bool present = false;
  DeviceLinear wq_b;             // [nh*hd, q_lora_rank]
  DeviceLinear weights_proj;     // [nh, D]
  DeviceCompressor compressor;
};

struct DeviceAttention {
  DeviceLinear wq_a, wq_b, wkv, wo_a, wo_b;
  const float* q_norm = nullptr;     // [q_lora_rank]
  const float* kv_norm = nullptr;    // [Dh]
  const float* attn_sink = nullptr;  // [H]
  DeviceCompressor compressor;
  DeviceIndexer indexer;
};

struct DeviceMoe {
  DeviceLinear gate;                   // router [E, D]
  const float* gate_bias = nullptr;    // [E] or null
  const int32_t* tid2eid = nullptr;    // [vocab, k] (hash layers) or null
  std::vector<ExpertSlot> host_slots;  // [E] the table's contents, as uploaded
  ExpertSlot* slots = nullptr;         // device table [E]
  DevFormat expert_format = DevFormat::kMXFP4;
  bool has_shared = false;
  ExpertSlot* shared_slot = nullptr;   // device table [1]
  ExpertSlot shared_host;              // the shared table's contents, as uploaded
  DevFormat shared_format = DevFormat::kFP8Block;
};

struct DeviceLayer {
  DeviceHc hc_attn, hc_ffn;
  const float* attn_norm = nullptr;  // [D]
  const float* ffn_norm = nullptr;   // [D]
  DeviceAttention attn;
  DeviceMoe ffn;
};

struct SyntheticModelOptions;  // runtime/device_synthetic.h

class DeviceModel {
 public:
  dsv4::ModelConfig config;
  const uint8_t* embed = nullptr;    // [vocab, D] as embed_format
  DevFormat embed_format = DevFormat::kBF16;
  DeviceLinear head;                 // [vocab, D]
  const float* norm = nullptr;       // [D]
  DeviceHc hc_head;
  std::vector<DeviceLayer> layers;
  size_t device_bytes() const { return arena_.used(); }

 private:
  friend Result<std::unique_ptr<DeviceModel>> upload_model(const dsv4::LoadedModel& model);
  friend Result<std::unique_ptr<DeviceModel>> make_synthetic_model(const dsv4::ModelConfig& cfg,
                                                                   const SyntheticModelOptions& opt);
  DeviceArena arena_;
};

// Copies every tensor the forward pass needs (not the MTP/DSpark blocks) to
// the current device. Fails with a Status naming the tensor for formats the
// CUDA backend does not read (ggml types outside ggml_type_on_device). A ggml
// embedding is widened to BF16 (one row is read per token).
Result<std::unique_ptr<DeviceModel>> upload_model(const dsv4::LoadedModel& model);

// One weight on its own (tests, gpucheck): `arena` must have room for
// linear_device_bytes(w).
size_t linear_device_bytes(const dsv4::Linear& w);
// As stored (a routed expert's weight).
Result<DeviceLinear> upload_linear(const dsv4::Linear& w, DeviceArena& arena);
// As upload_model places a dense weight: Q8_0 split into codes and scales
// (DevFormat::kQ8), every other format as stored.
Result<DeviceLinear> upload_dense_linear(const dsv4::Linear& w, DeviceArena& arena);

// True for the ggml block types (quant::GgmlType ids) the CUDA kernels decode.
bool ggml_type_on_device(int ggml_type);

// A small float tensor (F32/BF16/F16) widened to f32 on the host.
Result<std::vector<float>> tensor_f32_host(const TensorView& t);

}  // namespace aff::cuda
