// Per-sequence incremental state of the V4 forward pass. With it, one-shot
// prefill, chunked prefill of any chunk size and token-by-token decode compute
// the same thing: every piece of history a later token can see lives here.
#pragma once

#include <cstdint>
#include <vector>

#include "model/dsv4/compressor.h"

namespace aff::dsv4 {

struct LayerState {
  // Sliding-window ring of normed, RoPE'd KV latents (K = V):
  // [sliding_window, head_dim]; the token at position p lives in slot p % window.
  std::vector<float> window;
  CompressorState kv_comp;     // CSA/HCA: compressed attention entries [n, head_dim]
  CompressorState index_comp;  // CSA: indexer keys [n, index_head_dim]
};

class State {
 public:
  int64_t n_past = 0;          // tokens processed so far (= next position)
  int64_t max_positions = 0;   // capacity asked for at make_state
  int n_layers = 0;            // layers whose state is kept (all of the model's)
  int layers_run = -1;         // layers the sequence has run through (max_layers); -1 = none yet
  std::vector<LayerState> layers;
  std::vector<float> rope_main;      // inverse frequencies of sliding-only layers [rope_dim/2]
  std::vector<float> rope_compress;  // of compressed layers (YaRN when configured) [rope_dim/2]
};

}  // namespace aff::dsv4
