// A random-weight DeepSeek-V4 model built directly in device memory, for
// timing at full geometry without a checkpoint: the full V4-Flash model is
// ~100 GB at ~2.9 bits per expert weight, which must never pass through the
// host. The result is the same DeviceModel that upload_model produces (same
// slot tables, same formats), so every kernel runs exactly as it would on a
// loaded model; only the values are noise.
//
// Values: weight bytes come from a counter-based hash on the device; then
// every scale field (E8M0 block scales, ggml f16 block scales) is overwritten
// with a small finite value and FP8 weights are masked to |v| < 2, so no
// NaN/Inf appears and activations stay near unit scale through all layers.
// There is no CPU twin: the CPU reference cannot hold a 43-layer model, and
// the values carry no meaning, so this is for timing only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <cuda_runtime.h>

#include "affinity/status.h"
#include "backend/cuda/gpu_state.h"
#include "backend/cuda/runtime/device_model.h"
#include "model/dsv4/config.h"

namespace aff::cuda {

// How one family of weights is stored. kGgml names a ggml block type by its
// ggml spelling ("Q2_K", "IQ2_XXS"); the others are the checkpoint formats.
struct SyntheticFormat {
  enum class Kind { kFP8Block, kMXFP4, kBF16, kGgml };
  Kind kind = Kind::kMXFP4;
  std::string ggml;  // kGgml only

  std::string name() const;         // "fp8", "mxfp4", "bf16" or the ggml name
  double bits_per_weight() const;   // stored bits per weight, scales included
};

// Parses "fp8" | "mxfp4" | "bf16" | a ggml type name (case-insensitive).
Result<SyntheticFormat> parse_synthetic_format(const std::string& s);

struct SyntheticModelOptions {
  int layers = 43;                      // 1..config layers
  SyntheticFormat expert_gate_up;       // routed experts' w1/w3 [moe_inter, D]
  SyntheticFormat expert_down;          // routed experts' w2 [D, moe_inter]
  SyntheticFormat dense{SyntheticFormat::Kind::kFP8Block, ""};  // attention, shared expert, indexer wq_b
  SyntheticFormat head{SyntheticFormat::Kind::kBF16, ""};       // the output head [vocab, D]
  // Physical experts per layer; the 256 slots share them round-robin when
  // fewer (a model that would not fit otherwise). 0 = one per slot.
  int expert_pool = 0;
  uint64_t seed = 1;
};

// DeepSeek-V4-Flash's configuration (config.json of the release) with the
// first `layers` layers kept (compress ratios, hash layers as in the model).
dsv4::ModelConfig v4_flash_config(int layers = 43);

// Device bytes the model of `cfg` with `opt` takes (for a clear error before
// allocating, and for reports).
Result<size_t> synthetic_model_bytes(const dsv4::ModelConfig& cfg, const SyntheticModelOptions& opt);

// Weight bytes one decode token reads, counted from the model as built: the
// token's embedding row, every dense weight and vector of every layer (the
// shared expert included), `routed_per_token` routed experts per layer, the
// head. KV cache reads are not included (they depend on the context).
struct SyntheticBytes {
  size_t embed_row = 0;
  size_t dense = 0;   // all layers, plus final norm / hc_head
  size_t expert = 0;  // one routed expert (w1 + w3 + w2 with scales)
  size_t head = 0;
  int routed_per_token = 0, layers = 0;
  // Multiply-adds of the weight products per token (attention scores excluded).
  size_t dense_macs = 0, expert_macs = 0, head_macs = 0;
  size_t routed() const { return expert * size_t(routed_per_token) * size_t(layers); }
  size_t per_token() const { return embed_row + dense + routed() + head; }
  size_t macs_per_token() const {
    return dense_macs + expert_macs * size_t(routed_per_token) * size_t(layers) + head_macs;
  }
};
Result<SyntheticBytes> synthetic_decode_bytes(const dsv4::ModelConfig& cfg, const SyntheticModelOptions& opt);

// Random contents for a state's caches (window ring, compressor rings,
// compressed entries, indexer keys) as if `n_past` positions had been run,
// and n_past set: decode can then be timed at any context without a prefill.
// The state must hold n_past + the decode steps.
Status synthetic_fill_state(GpuState& state, int64_t n_past, uint64_t seed);

// Builds the model on the current device. Fails with a Status that names the
// bytes needed and free when the GPU is too small, or the format the CUDA
// backend cannot read.
Result<std::unique_ptr<DeviceModel>> make_synthetic_model(const dsv4::ModelConfig& cfg,
                                                          const SyntheticModelOptions& opt);

// ---- Device-side fills (device_synthetic.cu); every pointer is device memory.

// n bytes of hash noise, each byte b written as (b & and_mask) | or_mask.
Status synth_fill_bytes(uint8_t* p, size_t n, uint64_t seed, uint8_t and_mask, uint8_t or_mask,
                        cudaStream_t s);
// n f32 (or bf16) values uniform in [offset - amp, offset + amp].
Status synth_fill_f32(float* p, size_t n, uint64_t seed, float amp, float offset, cudaStream_t s);
Status synth_fill_bf16(uint16_t* p, size_t n, uint64_t seed, float amp, cudaStream_t s);
// In each of n_blocks blocks of block_bytes, the 2 bytes at `offset` become
// the f16 bit pattern `bits` (ggml block scales d / dmin).
Status synth_patch_u16(uint8_t* p, size_t n_blocks, size_t block_bytes, size_t offset, uint16_t bits,
                       cudaStream_t s);
// tid2eid [vocab, k] i32: k distinct experts in [0, E) per row.
Status synth_fill_tid2eid(int32_t* p, int64_t vocab, int k, int E, uint64_t seed, cudaStream_t s);

}  // namespace aff::cuda
