// The router's selection gap (Routing::gap) and the forward-pass probe built on
// it (dsv4/routing_margin.h): the gap must be the distance from the k-th
// selected expert to the best unselected one, recomputed here from the gate's
// scores, and it must be exactly the room the selection has: shifting the
// runner-up's bias by less than the smallest gap changes no selection, by more
// changes the one it was measured at. The GPU op checker relies on this to draw
// tokens free of near-ties.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <utility>

#include "backend/ref/linear.h"
#include "backend/ref/vec.h"
#include "model/dsv4/forward.h"
#include "model/dsv4/moe.h"
#include "model/dsv4/routing_margin.h"
#include "random_model.h"

namespace aff::dsv4 {
namespace {

// The random models' router biases live in mutable buffers the model owns; the
// tests shift them in place (and put them back). [n_routed_experts] f32.
float* mutable_bias(const MoeWeights& w) {
  EXPECT_EQ(w.gate_bias.dtype, DType::kF32);
  return reinterpret_cast<float*>(const_cast<uint8_t*>(w.gate_bias.data));
}

std::vector<int32_t> sorted(std::vector<int32_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

// Token t's experts as a sorted set: experts [T, k].
std::vector<int32_t> selection(const Routing& r, int64_t t) {
  return sorted({r.experts.begin() + t * r.k, r.experts.begin() + (t + 1) * r.k});
}

TEST(RouterGap, IsTheDistanceFromTheKthSelectedToTheBestUnselected) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const ModelConfig cfg = testing::tiny_config({0, 0}, 1);  // layer 0 hash, layer 1 learned
  auto model = testing::random_model(cfg, rng());
  ASSERT_NE(model, nullptr);
  const int64_t T = 31, D = cfg.hidden_size;
  const int E = cfg.n_routed_experts, k = cfg.n_experts_per_tok;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<int32_t> tokens(static_cast<size_t>(T));
  for (auto& t : tokens) t = int32_t(rng() % uint64_t(cfg.vocab_size));
  std::vector<float> x(size_t(T * D));
  const MoeWeights& w = model->weights.layers[1].ffn;
  Routing r;
  // Draws until the tightest token has f32 room for the shifts at the end (gaps
  // near f32 resolution, ~1e-7 here, would blur them); nearly every draw does.
  for (int attempt = 0; attempt < 8; ++attempt) {
    for (float& v : x) v = nd(rng);
    ASSERT_TRUE(moe_route(cfg, w, false, tokens.data(), x.data(), T, r).is_ok());
    ASSERT_EQ(r.gap.size(), size_t(T));
    ASSERT_EQ(r.runner_up.size(), size_t(T));
    if (*std::min_element(r.gap.begin(), r.gap.end()) > 1e-5f) break;
  }

  Routing hash;
  ASSERT_TRUE(moe_route(cfg, model->weights.layers[0].ffn, true, tokens.data(), x.data(), T, hash).is_ok());
  EXPECT_TRUE(hash.gap.empty());
  EXPECT_TRUE(hash.runner_up.empty());

  // The selection's values recomputed in double: sqrt(softplus(logit)) + bias.
  std::vector<float> logits(size_t(T * E));
  ref::linear(w.gate, x.data(), T, logits.data());
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> v(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e)
      v[size_t(e)] = std::sqrt(std::log1p(std::exp(double(logits[size_t(t * E + e)])))) +
                     ref::tensor_f32_at(w.gate_bias, e);
    const std::vector<int32_t> sel = selection(r, t);
    double low_in = INFINITY, high_out = -INFINITY;
    for (int e = 0; e < E; ++e) {
      if (std::binary_search(sel.begin(), sel.end(), e)) low_in = std::min(low_in, v[size_t(e)]);
      else high_out = std::max(high_out, v[size_t(e)]);
    }
    EXPECT_GE(r.gap[size_t(t)], 0.0f) << "token " << t;
    EXPECT_NEAR(r.gap[size_t(t)], low_in - high_out, 1e-5) << "token " << t;
    // The k-th selected and the runner-up are the experts at either end of the gap.
    EXPECT_NEAR(v[size_t(r.experts[size_t(t * k + k - 1)])], low_in, 1e-5) << "token " << t;
    EXPECT_FALSE(std::binary_search(sel.begin(), sel.end(), r.runner_up[size_t(t)])) << "token " << t;
    EXPECT_NEAR(v[size_t(r.runner_up[size_t(t)])], high_out, 1e-5) << "token " << t;
  }

  // Shifting the runner-up of the tightest token: by less than its gap nothing
  // moves (it is the smallest gap of the layer), by more it enters that token's
  // selection.
  const int64_t t0 = std::min_element(r.gap.begin(), r.gap.end()) - r.gap.begin();
  const float g = r.gap[size_t(t0)];
  ASSERT_GT(g, 1e-5f) << "no draw without a near-exact tie";
  float* bias = mutable_bias(w);
  const int32_t up = r.runner_up[size_t(t0)];
  const float saved = bias[up];
  for (float shift : {0.5f * g, 0.9f * g, 1.1f * g, 2.0f * g}) {
    bias[up] = saved + shift;
    Routing s;
    ASSERT_TRUE(moe_route(cfg, w, false, tokens.data(), x.data(), T, s).is_ok());
    bias[up] = saved;
    const bool flips = shift > g;
    for (int64_t t = 0; t < T; ++t) {
      const std::vector<int32_t> sel = selection(s, t);
      if (flips && t == t0) {
        EXPECT_TRUE(std::binary_search(sel.begin(), sel.end(), up)) << "shift " << shift / g << " x gap";
      } else if (!flips) {
        EXPECT_EQ(sel, selection(r, t)) << "token " << t << ", shift " << shift / g << " x gap";
      }
    }
  }
}

// (layer, position) -> sorted experts, for every MoE layer a forward pass routes.
using RouteMap = std::map<std::pair<int, int64_t>, std::vector<int32_t>>;

// Runs tokens as the probe does (prefill, then one token per call), recording
// the routes and the smallest gap seen through the observer.
RouteMap routes(const LoadedModel& m, const std::vector<int32_t>& tokens, int64_t prefill, float* min_gap) {
  RouteMap out;
  *min_gap = std::numeric_limits<float>::infinity();
  const RouteObserver obs = [&](int layer, int64_t pos0, const Routing& r) {
    for (int64_t t = 0; t < int64_t(r.experts.size()) / r.k; ++t) out[{layer, pos0 + t}] = selection(r, t);
    for (float g : r.gap) *min_gap = std::min(*min_gap, g);
  };
  ForwardOptions fo;
  fo.route_observer = &obs;
  auto st = make_state(m, int64_t(tokens.size()));
  std::vector<float> logits;
  const std::span<const int32_t> all(tokens);
  EXPECT_TRUE(forward(m, *st, all.first(size_t(prefill)), false, logits, fo).is_ok());
  for (size_t p = size_t(prefill); p < tokens.size(); ++p)
    EXPECT_TRUE(forward(m, *st, all.subspan(p, 1), false, logits, fo).is_ok());
  return out;
}

TEST(RoutingMargin, ProbeFindsTheSelectionNearestToFlippingInAForwardPass) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  // Layer 0 routes by hash, layers 1 (CSA) and 2 (sliding) by their routers.
  const ModelConfig cfg = testing::tiny_config({0, 4, 0}, 1);
  auto model = testing::random_model(cfg, rng());
  ASSERT_NE(model, nullptr);
  const int64_t prefill = 19, total = 23;  // 4 decode steps
  std::uniform_int_distribution<int32_t> tok(0, int32_t(cfg.vocab_size - 1));
  std::vector<int32_t> tokens(static_cast<size_t>(total));
  // Draws until the tightest selection has f32 room for the shifts below (as
  // the op checker redraws until its margin); nearly every first draw does.
  RoutingMargin m;
  for (int attempt = 0; attempt < 8; ++attempt) {
    for (auto& t : tokens) t = tok(rng);
    auto r = routing_margin(*model, tokens, prefill);
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    m = *r;
    if (m.gap > 1e-5f) break;
  }
  ASSERT_GT(m.gap, 1e-5f);
  EXPECT_EQ(m.decisions, 2 * total);  // learned layers x positions
  EXPECT_TRUE(m.layer == 1 || m.layer == 2) << m.layer;
  ASSERT_GE(m.position, 0);
  ASSERT_LT(m.position, total);

  float seen_gap = 0.0f;
  const RouteMap base = routes(*model, tokens, prefill, &seen_gap);
  EXPECT_EQ(seen_gap, m.gap);
  const std::vector<int32_t>& at = base.at({m.layer, m.position});
  EXPECT_TRUE(std::binary_search(at.begin(), at.end(), m.last_selected));
  EXPECT_FALSE(std::binary_search(at.begin(), at.end(), m.runner_up));

  // The bias only steers selection, so while no selection changes nothing
  // else does: below the gap every layer routes every position as before;
  // above it the runner-up enters at the probe's position (earlier layers and
  // this layer's inputs are untouched).
  float* bias = mutable_bias(model->weights.layers[size_t(m.layer)].ffn);
  const float saved = bias[m.runner_up];
  for (float shift : {0.5f * m.gap, 0.9f * m.gap, 1.1f * m.gap, 2.0f * m.gap}) {
    bias[m.runner_up] = saved + shift;
    float g = 0.0f;
    const RouteMap shifted = routes(*model, tokens, prefill, &g);
    bias[m.runner_up] = saved;
    if (shift < m.gap) {
      EXPECT_EQ(shifted, base) << "shift " << shift / m.gap << " x gap";
    } else {
      const std::vector<int32_t>& now = shifted.at({m.layer, m.position});
      EXPECT_TRUE(std::binary_search(now.begin(), now.end(), m.runner_up)) << "shift " << shift / m.gap << " x gap";
    }
  }
}

TEST(RoutingMargin, HashOnlyModelsHaveNoGapAndBadSplitsAreRejected) {
  const ModelConfig cfg = testing::tiny_config({0, 4}, 2);
  auto model = testing::random_model(cfg, 11);
  ASSERT_NE(model, nullptr);
  const std::vector<int32_t> tokens = {3, 1, 4, 1, 5, 9};
  auto r = routing_margin(*model, tokens, 4);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->decisions, 0);
  EXPECT_EQ(r->layer, -1);
  EXPECT_TRUE(std::isinf(r->gap) && r->gap > 0.0f);
  EXPECT_EQ(routing_margin(*model, tokens, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(routing_margin(*model, tokens, 7).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace aff::dsv4
