// V4 attention for all three layer types, float32:
//   sliding (ratio 0): keys = the last sliding_window positions (self included);
//   HCA: + every visible compressed entry; CSA: + the indexer's top-k entries.
// One shared latent serves as K and V for all heads (MQA), partial interleaved
// RoPE on the trailing rope_dim dims, a learned sink logit per head, output
// de-rotation at the query position, then the grouped low-rank projection.
#pragma once

#include <cstdint>
#include <vector>

#include "model/dsv4/config.h"
#include "model/dsv4/state.h"
#include "model/dsv4/weights.h"

namespace aff::dsv4 {

// Attention of layer `layer` over the chunk x: [T, D] (attention input after
// attn_norm) at positions [pos0, pos0 + T); appends the chunk to st (window
// ring, compressors) and writes out: [T, D].
void attention_forward(const ModelConfig& cfg, const AttentionWeights& w, int layer,
                       const State& state, LayerState& st, const float* x, int64_t T,
                       int64_t pos0, float* out);

}  // namespace aff::dsv4
