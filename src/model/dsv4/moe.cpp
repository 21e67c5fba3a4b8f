#include "model/dsv4/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/ref/activation.h"
#include "backend/ref/linear.h"
#include "backend/ref/vec.h"
#include "core/check.h"

namespace aff::dsv4 {
namespace {

float score_fn(const std::string& func, float logit) {
  if (func == "sigmoid") return ref::sigmoid(logit);
  return std::sqrt(ref::softplus(logit));  // "sqrtsoftplus" (V4)
}

}  // namespace

Status moe_route(const ModelConfig& cfg, const MoeWeights& w, bool hash_layer,
                 const int32_t* tokens, const float* x, int64_t T, Routing& routing) {
  const int E = cfg.n_routed_experts, k = cfg.n_experts_per_tok;
  std::vector<float> scores(size_t(T * E));
  ref::linear(w.gate, x, T, scores.data());
  if (cfg.scoring_func == "softmax") {
    for (int64_t t = 0; t < T; ++t) ref::softmax(scores.data() + t * E, E);
  } else {
    for (float& s : scores) s = score_fn(cfg.scoring_func, s);
  }
  std::vector<float> bias(size_t(E), 0.0f);
  if (!hash_layer && w.gate_bias.valid()) bias = ref::tensor_to_f32(w.gate_bias);

  routing.k = k;
  routing.experts.assign(size_t(T * k), 0);
  routing.weights.assign(size_t(T * k), 0.0f);
  std::vector<int32_t> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const float* s = scores.data() + t * E;
    int32_t* sel = routing.experts.data() + t * k;
    if (hash_layer) {
      const int64_t row = tokens[t];
      for (int i = 0; i < k; ++i) {
        const int64_t e = ref::tensor_i64_at(w.tid2eid, row * k + i);
        if (e < 0 || e >= E)
          return corrupt(w.tid2eid.name + " in " + w.tid2eid.file + ": token " +
                         std::to_string(row) + " maps to expert " + std::to_string(e) +
                         ", outside [0, " + std::to_string(E) + ")");
        sel[i] = int32_t(e);
      }
    } else {
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
        const float va = s[a] + bias[size_t(a)], vb = s[b] + bias[size_t(b)];
        return va > vb || (va == vb && a < b);
      });
      std::copy_n(order.begin(), k, sel);
    }
    float sum = 0.0f;
    for (int i = 0; i < k; ++i) sum += s[sel[i]];
    // transformers adds 1e-20 to the normaliser; immaterial in f32 for sum > 0.
    for (int i = 0; i < k; ++i)
      routing.weights[size_t(t * k + i)] =
          s[sel[i]] / (sum + 1e-20f) * float(cfg.routed_scaling_factor);
  }
  return Status::ok();
}

void expert_forward(const ModelConfig& cfg, const ExpertWeights& e, const float* x, int64_t T,
                    float* out) {
  const int64_t I = e.w1.out;
  std::vector<float> a(size_t(T * I)), b(size_t(T * I));
  ref::linear(e.w1, x, T, a.data());
  ref::linear(e.w3, x, T, b.data());
  const float L = float(cfg.swiglu_limit);
  for (size_t i = 0; i < a.size(); ++i) {
    float g = a[i], u = b[i];
    if (L > 0.0f) {
      g = std::min(g, L);
      u = std::clamp(u, -L, L);
    }
    a[i] = ref::silu(g) * u;
  }
  ref::linear(e.w2, a.data(), T, out);
}

Status moe_forward(const ModelConfig& cfg, const MoeWeights& w, bool hash_layer,
                   const int32_t* tokens, const float* x, int64_t T, bool no_routed, float* out,
                   Routing* routing_out) {
  const int64_t D = cfg.hidden_size;
  std::fill(out, out + T * D, 0.0f);
  if (!no_routed) {
    Routing routing;
    AFF_RETURN_IF_ERROR(moe_route(cfg, w, hash_layer, tokens, x, T, routing));
    const int k = routing.k;
    // Tokens grouped by expert, so each expert's weights are read once per chunk.
    std::vector<std::vector<std::pair<int64_t, float>>> by_expert(size_t(cfg.n_routed_experts));
    for (int64_t t = 0; t < T; ++t)
      for (int i = 0; i < k; ++i)
        by_expert[size_t(routing.experts[size_t(t * k + i)])].push_back(
            {t, routing.weights[size_t(t * k + i)]});
    std::vector<float> xs, ys;
    for (size_t e = 0; e < by_expert.size(); ++e) {
      const auto& list = by_expert[e];
      if (list.empty()) continue;
      const int64_t n = int64_t(list.size());
      xs.resize(size_t(n * D));
      ys.resize(size_t(n * D));
      for (int64_t i = 0; i < n; ++i) std::copy_n(x + list[size_t(i)].first * D, D, xs.data() + i * D);
      expert_forward(cfg, w.experts[e], xs.data(), n, ys.data());
      for (int64_t i = 0; i < n; ++i)
        ref::axpy(list[size_t(i)].second, ys.data() + i * D, out + list[size_t(i)].first * D, D);
    }
    if (routing_out != nullptr) *routing_out = std::move(routing);
  }
  if (w.has_shared) {
    std::vector<float> ys(size_t(T * D));
    expert_forward(cfg, w.shared, x, T, ys.data());
    for (int64_t i = 0; i < T * D; ++i) out[i] += ys[size_t(i)];
  }
  return Status::ok();
}

}  // namespace aff::dsv4
