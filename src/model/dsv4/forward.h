// The V4 forward pass on the CPU reference backend: float32 math reading the
// stored weights directly. Incremental: a State carries the sliding-window ring,
// the compressors' pending windows, compressed entries and indexer keys, so that
// one-shot prefill, chunked prefill and token-by-token decode give the same logits.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "affinity/status.h"
#include "model/dsv4/loaded_model.h"
#include "model/dsv4/moe.h"
#include "model/dsv4/state.h"  // complete type: callers own unique_ptr<State>

namespace aff::dsv4 {

struct ForwardOptions {
  int max_layers = -1;              // run only the first N layers (debug); -1 = all
  bool no_routed_experts = false;   // skip routed experts (shared expert only; debug)
  // Optional taps, free when null. hidden_out receives the residual streams
  // after the last layer, before hc_head: [T, hc_mult, D] (the MTP block's
  // input). route_observer sees every MoE layer's routing.
  std::vector<float>* hidden_out = nullptr;
  const RouteObserver* route_observer = nullptr;
};

// A fresh state for one sequence of at most max_positions tokens.
std::unique_ptr<State> make_state(const LoadedModel& model, int64_t max_positions);
int64_t state_n_past(const State& state);
void state_reset(State& state);

// Runs `tokens` at positions [n_past, n_past + T) and advances the state.
// logits: if all_positions, resized to [T, vocab] row-major; else to [vocab]
// for the last token only.
Status forward(const LoadedModel& model, State& state, std::span<const int32_t> tokens,
               bool all_positions, std::vector<float>& logits, const ForwardOptions& opts = {});

}  // namespace aff::dsv4
