// Lightning indexer of CSA layers: scores every visible compressed entry for
// each query, sum_h w[t,h] * ReLU(q[t,h] . k[j]), and keeps the top index_topk.
// Float32, no Hadamard rotation and no FP4 simulation (those only change
// rounding in the official kernels; the transformers model has neither).
#pragma once

#include <cstdint>
#include <vector>

#include "model/dsv4/compressor.h"
#include "model/dsv4/config.h"
#include "model/dsv4/weights.h"

namespace aff::dsv4 {

// Runs the indexer's own compressor over the chunk (keys become selectable as
// soon as their block is complete), then selects for each of the T queries.
//   x:  [T, D] attention input (after attn_norm); qr: [T, q_lora_rank] the
//   normed q low-rank activation; positions [pos0, pos0 + T).
//   keys: the indexer compressor state (entries [n, index_head_dim]).
//   selected[t]: ids of the chosen entries, all visible to query t, at most
//   index_topk of them (all visible ones when there are fewer), any order.
void indexer_select(const IndexerWeights& w, const ModelConfig& cfg,
                    const std::vector<float>& inv_freq, const float* x, const float* qr, int64_t T,
                    int64_t pos0, CompressorState& keys,
                    std::vector<std::vector<int32_t>>& selected);

}  // namespace aff::dsv4
