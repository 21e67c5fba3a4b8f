// KV compressor of CSA/HCA layers (and of the CSA indexer): every `ratio`
// consecutive tokens become one compressed entry, a per-channel softmax-gated
// pool of their projections, RMS-normed and RoPE'd at the block's first
// position. With overlap (CSA, ratio 4) each entry pools 2*ratio slots: the
// first halves ("A") of the previous block's tokens and the second halves ("B")
// of its own block's tokens. Streaming: tokens may arrive in any chunking and
// the entries are identical to a one-shot pass.
#pragma once

#include <cstdint>
#include <vector>

#include "model/dsv4/config.h"
#include "model/dsv4/weights.h"

namespace aff::dsv4 {

struct CompressorState {
  // Tokens of the block being filled, rows [0, n_pending): projected kv and
  // gate logits (+ ape of the token's slot), [ratio, c*dim] each.
  std::vector<float> cur_kv, cur_gate;
  int n_pending = 0;
  // Overlap only: A halves of the last completed block, [ratio, dim] each.
  std::vector<float> prev_kv, prev_gate;
  bool has_prev = false;
  // Finished entries, [n_entries, dim]: entry j covers tokens [j*ratio, (j+1)*ratio)
  // and becomes visible to a query at position p once j < (p + 1) / ratio.
  std::vector<float> entries;
  int64_t n_entries = 0;

  void reset();
};

// Feeds the tokens x: [T, D] at positions [pos0, pos0 + T) (pos0 must equal the
// number of tokens fed so far) and appends every entry they complete.
// inv_freq: the layer's compress-rope inverse frequencies [rope_dim / 2]; RoPE
// acts on the trailing rope_dim dims of each entry.
void compressor_run(const CompressorWeights& w, const ModelConfig& cfg,
                    const std::vector<float>& inv_freq, const float* x, int64_t T, int64_t pos0,
                    CompressorState& st);

// Number of entries visible to a query at position pos.
inline int64_t compressor_visible(int ratio, int64_t pos) { return (pos + 1) / ratio; }

}  // namespace aff::dsv4
