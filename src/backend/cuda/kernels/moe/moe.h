// Mixture-of-experts kernels: the router (score function, bias-steered top-k or
// hash table, normalised weights) and the expert SwiGLU FFN batched over
// (token, expert) pairs, reading experts through a slot table.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "affinity/status.h"
#include "backend/cuda/runtime/device_weights.h"

namespace aff::cuda {

enum class ScoreFunc : int32_t { kSqrtSoftplus, kSigmoid, kSoftmax };

struct RouterArgs {
  const float* logits = nullptr;   // [T, E] router logits (gate x)
  const float* bias = nullptr;     // [E] selection bias, or null (hash layers ignore it)
  const int32_t* tid2eid = nullptr;  // [vocab, k] hash table, or null for top-k layers
  const int32_t* tokens = nullptr;   // [T] token ids (hash layers)
  int64_t T = 0;
  int E = 0, k = 0;
  ScoreFunc func = ScoreFunc::kSqrtSoftplus;
  float scaling = 1.0f;            // routed_scaling_factor
  int32_t* ids = nullptr;          // out [T, k] expert ids
  float* weights = nullptr;        // out [T, k] normalised weights x scaling
};

// Top-k picks the k largest score + bias (ties: lower id); the weights use the
// unbiased scores: w_i = s_i / (sum_selected s + 1e-20) * scaling.
Status router_topk(const RouterArgs& a, cudaStream_t stream);

struct ExpertFfnArgs {
  const ExpertSlot* slots = nullptr;  // device table, indexed by expert id
  DevFormat format = DevFormat::kMXFP4;  // storage of every expert in the table
  const int32_t* ids = nullptr;       // [n_pairs] expert of pair p (token p / pairs_per_token)
  int64_t n_pairs = 0;
  int pairs_per_token = 1;
  const float* x = nullptr;           // [T, D] expert input
  int64_t D = 0, inter = 0;           // hidden size, expert intermediate size
  float swiglu_limit = 0.0f;          // 0 disables the clamp
  float* act = nullptr;               // scratch [n_pairs, inter]
  float* y = nullptr;                 // out [n_pairs, D], unweighted expert outputs
};

// y[p] = w2 (silu(min(w1 x, L)) * clamp(w3 x, -L, L)) for every pair p, with
// x = x[p / pairs_per_token] and the expert of slot ids[p].
Status expert_ffn(const ExpertFfnArgs& a, cudaStream_t stream);

// out[t, d] = sum_i weights[t, i] * y[t*k + i, d] (+ add[t, d] when add != null).
//   weights: [T, k]; y: [T*k, D]; add, out: [T, D]. out may alias add.
Status moe_combine(const float* weights, const float* y, int64_t T, int k, int64_t D, const float* add,
                   float* out, cudaStream_t stream);

}  // namespace aff::cuda
