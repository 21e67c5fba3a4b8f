// The V4 forward pass on one GPU: the same incremental contract as the CPU
// reference (model/dsv4/forward.h) -- one-shot prefill, chunked prefill and
// token-by-token decode give the same logits -- with weights in their stored
// formats and all state (rings, compressor state, compressed entries, indexer
// keys) in device memory. f32 activations this round.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "affinity/status.h"
#include "backend/cuda/gpu_state.h"
#include "backend/cuda/runtime/device_model.h"
#include "model/dsv4/forward.h"

namespace aff::cuda {

// Runs `tokens` at positions [n_past, n_past + T) and advances the state.
// Inputs longer than the state's max_chunk are split into chunks.
// logits: [T, vocab] row-major when all_positions, else [vocab] (last token).
Status gpu_forward(const DeviceModel& model, GpuState& state, std::span<const int32_t> tokens,
                   bool all_positions, std::vector<float>& logits, const dsv4::ForwardOptions& opts = {});

// The same, returning only the greedy next token of the last position
// (argmax computed on the device; only 4 bytes come back).
Result<int32_t> gpu_forward_greedy(const DeviceModel& model, GpuState& state, std::span<const int32_t> tokens,
                                   const dsv4::ForwardOptions& opts = {});

}  // namespace aff::cuda
