// Top level of the V4 forward pass: embedding -> hc_mult identical streams ->
// layers (mHC-wrapped attention and MoE) -> hc_head collapse -> norm -> head.
#include "model/dsv4/forward.h"

#include <algorithm>
#include <string>

#include "backend/ref/linear.h"
#include "backend/ref/norm.h"
#include "backend/ref/vec.h"
#include "core/dtype.h"
#include "model/dsv4/attention.h"
#include "model/dsv4/mhc.h"
#include "model/dsv4/moe.h"
#include "model/dsv4/state.h"

namespace aff::dsv4 {
namespace {

// Embedding rows for the tokens, each copied into all hc streams: h: [T, hc, D].
void embed_tokens(const ModelConfig& cfg, const ModelWeights& wts, std::span<const int32_t> tokens,
                  float* h) {
  const int64_t D = cfg.hidden_size;
  const int hc = cfg.hc_mult;
  for (size_t t = 0; t < tokens.size(); ++t) {
    float* row = h + int64_t(t) * hc * D;
    const int64_t base = int64_t(tokens[t]) * D;
    if (wts.embed_rows.valid()) {  // a GGUF table in a ggml block format
      ref::linear_dequant_row(wts.embed_rows, tokens[t], row);
    } else {
      for (int64_t d = 0; d < D; ++d) row[d] = ref::tensor_f32_at(wts.embed, base + d);
    }
    for (int j = 1; j < hc; ++j) std::copy_n(row, D, row + j * D);
  }
}

// Weighted RMSNorm of x: [T, D] with a stored weight vector.
void norm_rows(const ModelConfig& cfg, const TensorView& weight, float* x, int64_t T) {
  const std::vector<float> w = ref::tensor_to_f32(weight);
  ref::rmsnorm(x, T, cfg.hidden_size, w.data(), float(cfg.rms_norm_eps));
}

}  // namespace

Status forward(const LoadedModel& model, State& state, std::span<const int32_t> tokens,
               bool all_positions, std::vector<float>& logits, const ForwardOptions& opts) {
  ref::adapt_threads_to_load();
  const ModelConfig& cfg = model.config;
  const ModelWeights& wts = model.weights;
  const int64_t T = int64_t(tokens.size());
  const int64_t D = cfg.hidden_size;
  const int hc = cfg.hc_mult;
  const int64_t pos0 = state.n_past;
  if (T == 0) return invalid_argument("forward: no tokens given");
  if (pos0 + T > state.max_positions)
    return out_of_range("forward: positions up to " + std::to_string(pos0 + T) +
                        " exceed the state's capacity of " + std::to_string(state.max_positions));
  for (int64_t t = 0; t < T; ++t)
    if (tokens[size_t(t)] < 0 || tokens[size_t(t)] >= cfg.vocab_size)
      return invalid_argument("forward: token id " + std::to_string(tokens[size_t(t)]) +
                              " at index " + std::to_string(t) + " is outside the vocabulary [0, " +
                              std::to_string(cfg.vocab_size) + ")");
  int n_layers = cfg.num_layers;
  if (opts.max_layers >= 0) n_layers = std::min(n_layers, opts.max_layers);
  if (int(wts.layers.size()) < n_layers || state.n_layers < n_layers)
    return internal_error("forward: model has fewer bound layers than configured");
  // Layers skipped by an earlier call have no history for later positions.
  if (state.n_past > 0 && state.layers_run != n_layers)
    return invalid_argument("forward: this sequence ran " + std::to_string(state.layers_run) +
                            " layers so far; max_layers must stay the same until state_reset");
  state.layers_run = n_layers;

  std::vector<float> h(size_t(T * hc * D)), x(size_t(T * D)), y(size_t(T * D));
  embed_tokens(cfg, wts, tokens, h.data());
  HcMix mix;
  for (int l = 0; l < n_layers; ++l) {
    const LayerWeights& lw = wts.layers[size_t(l)];
    LayerState& ls = state.layers[size_t(l)];

    hc_pre(cfg, lw.hc_attn, h.data(), T, x.data(), mix);
    norm_rows(cfg, lw.attn_norm, x.data(), T);
    attention_forward(cfg, lw.attn, l, state, ls, x.data(), T, pos0, y.data());
    hc_post(cfg, mix, y.data(), T, h.data());

    hc_pre(cfg, lw.hc_ffn, h.data(), T, x.data(), mix);
    norm_rows(cfg, lw.ffn_norm, x.data(), T);
    Routing routing;
    AFF_RETURN_IF_ERROR(moe_forward(cfg, lw.ffn, cfg.is_hash_layer(l), tokens.data(), x.data(), T,
                                    opts.no_routed_experts, y.data(),
                                    opts.route_observer != nullptr ? &routing : nullptr));
    if (opts.route_observer != nullptr && !opts.no_routed_experts) (*opts.route_observer)(l, pos0, routing);
    hc_post(cfg, mix, y.data(), T, h.data());
  }
  state.n_past = pos0 + T;
  if (opts.hidden_out != nullptr) opts.hidden_out->assign(h.begin(), h.end());

  // Only the rows whose logits are wanted go through the final collapse and head.
  const int64_t first = all_positions ? 0 : T - 1;
  const int64_t n_out = T - first;
  hc_head(cfg, wts.hc_head, h.data() + first * hc * D, n_out, x.data());
  norm_rows(cfg, wts.norm, x.data(), n_out);
  logits.resize(size_t(n_out * cfg.vocab_size));
  ref::linear(wts.head, x.data(), n_out, logits.data());
  return Status::ok();
}

}  // namespace aff::dsv4
