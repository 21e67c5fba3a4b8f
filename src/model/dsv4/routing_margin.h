// How close a token sequence's learned routing comes to a near-tie: the
// smallest top-k selection gap (moe.h, Routing::gap) over every learned-router
// layer and token of a CPU reference forward pass. Two backends whose router
// scores differ by more than this may route a token to different experts, and
// comparing their outputs then compares different computations (the GPU op
// checker redraws its tokens until the gap clears a margin). Hash-routed layers
// have no gap.
#pragma once

#include <cstdint>
#include <limits>
#include <span>

#include "affinity/status.h"
#include "model/dsv4/loaded_model.h"
#include "model/dsv4/moe.h"

namespace aff::dsv4 {

struct RoutingMargin {
  // Smallest gap seen (score + bias units; NaN counts as -inf); +inf when no
  // learned-router decision was seen.
  float gap = std::numeric_limits<float>::infinity();
  int layer = -1;               // where the smallest gap is
  int64_t position = -1;
  int32_t last_selected = -1;   // there: the k-th (lowest) selected expert
  int32_t runner_up = -1;       // and the best unselected one
  int64_t decisions = 0;        // learned-router (layer, token) selections seen

  // Folds in one layer's routing of the tokens at positions [pos0, pos0 + T)
  // (a RouteObserver's arguments). Hash-layer routings (no gaps) add nothing.
  void observe(int layer, int64_t pos0, const Routing& routing);
};

// Runs `tokens` through a fresh CPU reference state, the first `prefill` in one
// call and the rest one token per call (as a prefill followed by decode steps),
// through the first max_layers layers (-1: all), and returns the smallest gap.
// 1 <= prefill <= tokens.size().
Result<RoutingMargin> routing_margin(const LoadedModel& model, std::span<const int32_t> tokens,
                                     int64_t prefill, int max_layers = -1);

}  // namespace aff::dsv4
