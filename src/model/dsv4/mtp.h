// The V4-Flash MTP block (multi-token prediction, v4-model-math.md §8.1) on the
// CPU reference backend. Row t pairs the main model's residual streams at
// position t (before hc_head) with the token at t+1 and predicts the token at
// t+2:
//   e = enorm(embed[t+1]); x = e_proj(e) (same for every stream) + h_proj(hnorm(h_t))
//   x = one decoder block (mHC, attention with its own window ring, MoE)
//   logits = head(norm(hc_head_mtp(x)))          embed and head shared with the model
// The block keeps its own incremental state, so rows may arrive in any chunking;
// MTP row t sits at position t, like the main model's row t.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "affinity/status.h"
#include "model/dsv4/loaded_model.h"
#include "model/dsv4/moe.h"
#include "model/dsv4/state.h"

namespace aff::dsv4 {

// A fresh state for MTP block `block` (0 for V4-Flash) over at most
// max_positions rows: a State whose single LayerState is the block's (window
// ring, compressor state if its compress ratio is non-zero); n_past counts rows.
// Fails when the model has no such block.
Result<std::unique_ptr<State>> make_mtp_state(const LoadedModel& model, int64_t max_positions, int block = 0);

// Runs MTP rows [n_past, n_past + T) and advances the state.
//   hidden: [T, hc_mult, D], the main model's streams before hc_head at those
//           positions (ForwardOptions::hidden_out)
//   next_tokens: [T], the token that follows each of those positions
//   logits: resized to [T, vocab] (all_positions) or [vocab] (last row only);
//           row i predicts the token two after position n_past + i
// route_observer (optional) sees the block's routing as layer num_layers + block.
Status mtp_forward(const LoadedModel& model, State& state, std::span<const float> hidden,
                   std::span<const int32_t> next_tokens, bool all_positions, std::vector<float>& logits,
                   int block = 0, const RouteObserver* route_observer = nullptr);

}  // namespace aff::dsv4
