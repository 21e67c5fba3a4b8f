#include "model/dsv4/moe.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "backend/cpu/moe_lane.h"
#include "backend/ref/activation.h"
#include "backend/ref/linear.h"
#include "backend/ref/vec.h"
#include "core/check.h"

namespace aff::dsv4 {
namespace {

// Up to this many tokens a layer's experts go to the CPU lane together (one parallel
// region, cpu::moe_lane_experts); larger batches give each projection enough rows x
// tokens that a fork per projection is cheap, and would need T*k*moe_inter*8 bytes of
// scratch at once.
constexpr int64_t kMoeLaneMaxTokens = 64;

// The CPU lane's dispatch: all experts of the layer with tokens (routed, then shared) in
// one call, combined in the same order as the per-expert loop below, so the result is
// bit-identical to it. False (nothing written) when an expert's weights are not on the
// lane; the caller then runs the per-expert loop.
bool moe_experts_on_cpu_lane(const ModelConfig& cfg, const MoeWeights& w,
                             const std::vector<std::vector<std::pair<int64_t, float>>>& by_expert,
                             const float* x, int64_t T, float* out) {
  if (T > kMoeLaneMaxTokens) return false;
  const int64_t D = cfg.hidden_size;
  std::vector<cpu::ExpertJob> jobs;
  std::vector<size_t> job_expert;  // routed expert of jobs[i]; the shared one is last
  int64_t rows = 0;
  for (size_t e = 0; e < by_expert.size(); ++e) {
    if (by_expert[e].empty()) continue;
    if (!cpu::moe_lane_supported(w.experts[e])) return false;
    jobs.push_back({&w.experts[e], nullptr, int64_t(by_expert[e].size()), nullptr});
    job_expert.push_back(e);
    rows += int64_t(by_expert[e].size());
  }
  if (w.has_shared) {
    if (!cpu::moe_lane_supported(w.shared)) return false;
    jobs.push_back({&w.shared, x, T, nullptr});
    rows += T;
  }
  std::vector<float> xs(size_t(rows * D)), ys(size_t(rows * D));
  int64_t off = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    jobs[i].y = ys.data() + off * D;
    if (i < job_expert.size()) {
      const auto& list = by_expert[job_expert[i]];
      for (size_t r = 0; r < list.size(); ++r)
        std::copy_n(x + list[r].first * D, D, xs.data() + (off + int64_t(r)) * D);
      jobs[i].x = xs.data() + off * D;
    }
    off += jobs[i].n;
  }
  if (!cpu::moe_lane_experts(jobs, float(cfg.swiglu_limit))) return false;
  for (size_t i = 0; i < job_expert.size(); ++i) {
    const auto& list = by_expert[job_expert[i]];
    for (size_t r = 0; r < list.size(); ++r)
      ref::axpy(list[r].second, jobs[i].y + int64_t(r) * D, out + list[r].first * D, D);
  }
  if (w.has_shared) {
    const float* ysh = jobs.back().y;
    for (int64_t i = 0; i < T * D; ++i) out[i] += ysh[i];
  }
  return true;
}

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
  routing.gap.clear();
  routing.runner_up.clear();
  if (!hash_layer) {
    routing.gap.assign(size_t(T), std::numeric_limits<float>::infinity());
    routing.runner_up.assign(size_t(T), -1);
  }
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
      auto value = [&](int32_t e) { return s[e] + bias[size_t(e)]; };
      auto before = [&](int32_t a, int32_t b) {
        const float va = value(a), vb = value(b);
        return va > vb || (va == vb && a < b);
      };
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
      std::copy_n(order.begin(), k, sel);
      // The margin of this choice: the k-th selected (order[k-1], the selection
      // is sorted) against the best of the rest, compared as the sort compares.
      if (k > 0 && k < E) {
        const int32_t next = *std::min_element(order.begin() + k, order.end(), before);
        routing.gap[size_t(t)] = value(order[size_t(k - 1)]) - value(next);
        routing.runner_up[size_t(t)] = next;
      }
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
    if (moe_experts_on_cpu_lane(cfg, w, by_expert, x, T, out)) {
      if (routing_out != nullptr) *routing_out = std::move(routing);
      return Status::ok();
    }
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
