#include "model/dsv4/state.h"

#include "backend/ref/rope.h"
#include "model/dsv4/forward.h"

namespace aff::dsv4 {

std::unique_ptr<State> make_state(const LoadedModel& model, int64_t max_positions) {
  const ModelConfig& cfg = model.config;
  auto st = std::make_unique<State>();
  st->max_positions = max_positions;
  st->n_layers = cfg.num_layers;
  st->layers.resize(size_t(cfg.num_layers));
  for (LayerState& l : st->layers)
    l.window.assign(size_t(int64_t(cfg.sliding_window) * cfg.head_dim), 0.0f);
  st->rope_main = ref::rope_inv_freq(cfg.rope_theta, cfg.rope_dim, nullptr);
  ref::YarnParams yarn;
  yarn.factor = cfg.rope_scaling.factor;
  yarn.original_max_position = cfg.rope_scaling.original_max_position;
  yarn.beta_fast = cfg.rope_scaling.beta_fast;
  yarn.beta_slow = cfg.rope_scaling.beta_slow;
  st->rope_compress = ref::rope_inv_freq(cfg.compress_rope_theta, cfg.rope_dim,
                                         cfg.rope_scaling.yarn ? &yarn : nullptr);
  return st;
}

int64_t state_n_past(const State& state) { return state.n_past; }

void state_reset(State& state) {
  state.n_past = 0;
  state.layers_run = -1;
  for (LayerState& l : state.layers) {
    std::fill(l.window.begin(), l.window.end(), 0.0f);
    l.kv_comp.reset();
    l.index_comp.reset();
  }
}

}  // namespace aff::dsv4
