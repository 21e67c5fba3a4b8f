#include "model/dsv4/mtp.h"

#include <string>

#include "backend/ref/linear.h"
#include "backend/ref/norm.h"
#include "backend/ref/vec.h"
#include "model/dsv4/attention.h"
#include "model/dsv4/forward.h"
#include "model/dsv4/mhc.h"

namespace aff::dsv4 {
namespace {

// One embedding row: embed: [vocab, D] (or a ggml table in embed_rows); out: [D].
void embed_row(const ModelWeights& wts, int64_t D, int32_t token, float* out) {
  if (wts.embed_rows.valid()) {
    ref::linear_dequant_row(wts.embed_rows, token, out);
    return;
  }
  const int64_t base = int64_t(token) * D;
  for (int64_t d = 0; d < D; ++d) out[d] = ref::tensor_f32_at(wts.embed, base + d);
}

Status check_block(const LoadedModel& model, int block) {
  const ModelConfig& cfg = model.config;
  if (block < 0 || block >= int(model.weights.mtp.size()))
    return not_found(model.source + ": the model has no MTP block " + std::to_string(block) +
                     " (num_nextn_predict_layers = " + std::to_string(cfg.num_mtp_layers) + ")");
  if (int(cfg.compress_ratios.size()) <= cfg.num_layers + block)
    return invalid_argument(model.source + ": compress_ratios has no entry for MTP block " + std::to_string(block));
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<State>> make_mtp_state(const LoadedModel& model, int64_t max_positions, int block) {
  AFF_RETURN_IF_ERROR(check_block(model, block));
  // The main model's state brings the RoPE tables; only one layer's history is kept.
  std::unique_ptr<State> st = make_state(model, max_positions);
  st->layers.resize(1);
  st->layers.shrink_to_fit();
  st->n_layers = 1;
  return st;
}

Status mtp_forward(const LoadedModel& model, State& state, std::span<const float> hidden,
                   std::span<const int32_t> next_tokens, bool all_positions, std::vector<float>& logits,
                   int block, const RouteObserver* route_observer) {
  AFF_RETURN_IF_ERROR(check_block(model, block));
  const ModelConfig& cfg = model.config;
  const ModelWeights& wts = model.weights;
  const MtpWeights& mw = wts.mtp[size_t(block)];
  const LayerWeights& lw = mw.block;
  const int64_t T = int64_t(next_tokens.size());
  const int64_t D = cfg.hidden_size;
  const int hc = cfg.hc_mult;
  const int64_t pos0 = state.n_past;
  const int layer = cfg.num_layers + block;  // its compress_ratios / layer-id slot
  if (T == 0) return invalid_argument("mtp_forward: no rows given");
  if (int64_t(hidden.size()) != T * hc * D)
    return invalid_argument("mtp_forward: hidden holds " + std::to_string(hidden.size()) + " values, expected " +
                            std::to_string(T * hc * D) + " for " + std::to_string(T) + " rows");
  if (state.layers.size() != 1) return invalid_argument("mtp_forward: the state was not made by make_mtp_state");
  if (pos0 + T > state.max_positions)
    return out_of_range("mtp_forward: rows up to " + std::to_string(pos0 + T) + " exceed the state's capacity of " +
                        std::to_string(state.max_positions));
  for (int64_t t = 0; t < T; ++t)
    if (next_tokens[size_t(t)] < 0 || next_tokens[size_t(t)] >= cfg.vocab_size)
      return invalid_argument("mtp_forward: token id " + std::to_string(next_tokens[size_t(t)]) + " at index " +
                              std::to_string(t) + " is outside the vocabulary [0, " +
                              std::to_string(cfg.vocab_size) + ")");
  ref::adapt_threads_to_load();
  const float eps = float(cfg.rms_norm_eps);

  // x = e_proj(enorm(embed[next])) broadcast over the streams + h_proj(hnorm(h)).
  std::vector<float> e(size_t(T * D)), ep(size_t(T * D));
  for (int64_t t = 0; t < T; ++t) embed_row(wts, D, next_tokens[size_t(t)], e.data() + t * D);
  const std::vector<float> enorm = ref::tensor_to_f32(mw.enorm);
  ref::rmsnorm(e.data(), T, D, enorm.data(), eps);
  ref::linear(mw.e_proj, e.data(), T, ep.data());
  std::vector<float> hs(hidden.begin(), hidden.end()), h(size_t(T * hc * D));
  const std::vector<float> hnorm = ref::tensor_to_f32(mw.hnorm);
  ref::rmsnorm(hs.data(), T * hc, D, hnorm.data(), eps);  // each stream on its own
  ref::linear(mw.h_proj, hs.data(), T * hc, h.data());
  for (int64_t t = 0; t < T; ++t)
    for (int j = 0; j < hc; ++j) ref::axpy(1.0f, ep.data() + t * D, h.data() + (t * hc + j) * D, D);

  // The block, exactly as a main layer (forward.cpp) but on its own state.
  std::vector<float> x(size_t(T * D)), y(size_t(T * D));
  HcMix mix;
  LayerState& ls = state.layers[0];
  const std::vector<float> attn_norm = ref::tensor_to_f32(lw.attn_norm);
  const std::vector<float> ffn_norm = ref::tensor_to_f32(lw.ffn_norm);
  hc_pre(cfg, lw.hc_attn, h.data(), T, x.data(), mix);
  ref::rmsnorm(x.data(), T, D, attn_norm.data(), eps);
  attention_forward(cfg, lw.attn, layer, state, ls, x.data(), T, pos0, y.data());
  hc_post(cfg, mix, y.data(), T, h.data());
  hc_pre(cfg, lw.hc_ffn, h.data(), T, x.data(), mix);
  ref::rmsnorm(x.data(), T, D, ffn_norm.data(), eps);
  Routing routing;
  AFF_RETURN_IF_ERROR(moe_forward(cfg, lw.ffn, cfg.is_hash_layer(layer), next_tokens.data(), x.data(), T,
                                  /*no_routed=*/false, y.data(), route_observer != nullptr ? &routing : nullptr));
  if (route_observer != nullptr) (*route_observer)(layer, pos0, routing);
  hc_post(cfg, mix, y.data(), T, h.data());
  state.n_past = pos0 + T;

  // Its own collapse and norm, then the shared head.
  const int64_t first = all_positions ? 0 : T - 1;
  const int64_t n_out = T - first;
  hc_head(cfg, mw.hc_head, h.data() + first * hc * D, n_out, x.data());
  const std::vector<float> norm = ref::tensor_to_f32(mw.norm);
  ref::rmsnorm(x.data(), n_out, D, norm.data(), eps);
  logits.resize(size_t(n_out * cfg.vocab_size));
  ref::linear(wts.head, x.data(), n_out, logits.data());
  return Status::ok();
}

}  // namespace aff::dsv4
