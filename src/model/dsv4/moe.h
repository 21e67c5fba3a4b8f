// V4 mixture of experts, float32: a router (sqrt-softplus scores; the bias only
// steers selection; hash layers take their experts from tid2eid[token]),
// normalised top-k weights x routed_scaling_factor, SwiGLU experts with the
// swiglu_limit clamp, plus the shared expert.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "affinity/status.h"
#include "model/dsv4/config.h"
#include "model/dsv4/weights.h"

namespace aff::dsv4 {

// The experts chosen for T tokens and their weights.
struct Routing {
  int k = 0;
  std::vector<int32_t> experts;  // [T, k]; learned layers: best first
  std::vector<float> weights;    // [T, k], already x routed_scaling_factor
  // Learned layers only (empty for hash layers): how close each token's
  // selection was to changing, in the units it compares (score + bias, f32).
  // gap = value of the k-th selected expert - value of the best unselected one
  // (>= 0; +inf when k = E); runner_up is that unselected expert (-1 when k = E).
  // A backend whose scores differ by more than gap may choose other experts.
  std::vector<float> gap;          // [T]
  std::vector<int32_t> runner_up;  // [T]
};

// Router of one layer. x: [T, D] (after ffn_norm); tokens: [T] ids (hash layers).
// Fails (naming the tensor) if tid2eid holds an expert id out of range.
Status moe_route(const ModelConfig& cfg, const MoeWeights& w, bool hash_layer,
                 const int32_t* tokens, const float* x, int64_t T, Routing& routing);

// Sees each MoE layer's routing decision (routing statistics, expert
// profiling): layer index, position of the first of the routing's T tokens.
using RouteObserver = std::function<void(int layer, int64_t pos0, const Routing& routing)>;

// out: [T, D] = sum_i weight_i * E_i(x) + E_shared(x). With no_routed, only the
// shared expert (debug option). routing_out, when given, receives the routing.
Status moe_forward(const ModelConfig& cfg, const MoeWeights& w, bool hash_layer,
                   const int32_t* tokens, const float* x, int64_t T, bool no_routed, float* out,
                   Routing* routing_out = nullptr);

// One SwiGLU expert, unweighted: out[t] = w2 (silu(min(w1 x, L)) * clamp(w3 x, -L, L)),
// L = swiglu_limit (0 disables the clamp). x: [T, D]; out: [T, D].
void expert_forward(const ModelConfig& cfg, const ExpertWeights& e, const float* x, int64_t T,
                    float* out);

}  // namespace aff::dsv4
